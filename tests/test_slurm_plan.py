"""Slurm without a Slurm: the spec rules, the plan (sbatch, script, srun), parsing what Slurm prints,
the run's Slurm state, ending a run whose job is gone, and how the supervisor reads a signal."""

from __future__ import annotations

import json
import shlex
import signal
import textwrap

import pytest

from orchestrator.core.states import JobState
from orchestrator.plan.record import PlanRecord
from orchestrator.runs import RunDir
from orchestrator.schedulers import plan_spec, scheduler_named
from orchestrator.schedulers.slurm import commands as sc
from orchestrator.schedulers.slurm import handle as vs
from orchestrator.schedulers.slurm.commands import JobInfo
from orchestrator.schedulers.slurm.follow import ask_cancel_or_detach
from orchestrator.schedulers.slurm.plan import batch_script, restart_srun_argv, sbatch_argv, slurm_plan, srun_argv
from orchestrator.schedulers.slurm.state import SlurmState, request_stop, stop_requested
from orchestrator.schedulers.slurm.step import advertise_address
from orchestrator.spec import check_spec_text, load_spec_text
from worker_entry.protocol.env import Env

SPEC = """\
version: 1
name: sl
scheduler: slurm
slurm:
  nodes: 2
  tasks_per_node: 2
{extra_slurm}job:
  command: [python, train.py]
{extra}"""


def spec_text(extra_slurm: str = "", extra: str = "") -> str:
    return SPEC.format(extra_slurm=textwrap.indent(textwrap.dedent(extra_slurm), "  "), extra=extra)


def errors(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(text, "s.yaml") if p.severity == "error"]


# ----------------------------------------------------------------------------- the spec


def test_a_minimal_slurm_spec_gets_the_defaults():
    s = load_spec_text(spec_text()).spec.slurm
    assert (s.tasks_per_node, s.gpus_per_node, s.requeue, s.signal_lead_s, s.max_requeues) == (2, 0, True, 120, 10)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (
            spec_text().replace("scheduler: slurm\n", "scheduler: slurm\nhosts:\n  - address: a\n"),
            "s.yaml:4: hosts: not used with scheduler: slurm",
        ),
        (spec_text("time: '1:2:3:4'\n"), "s.yaml:7: slurm.time: '1:2:3:4' is not a Slurm time"),
        (spec_text("time: 10:00\n"), "s.yaml:7: slurm.time: read as the number 600: quote the time"),
        (spec_text("extra_args: ['--nodes=4']\n"), "--nodes is set by tfcluster"),
        (spec_text("extra_args: ['-N 4']\n"), "is not an sbatch long option"),
        (spec_text('extra_args: ["--comment=a\\nb"]\n'), "is not an sbatch long option"),
        (spec_text("gpus_per_node: 3\n"), "3 GPUs per node do not split evenly among 2 tasks"),
        (spec_text("partition: 'a b'\n"), "is not a Slurm name"),
        (spec_text().replace("slurm:\n  nodes: 2\n  tasks_per_node: 2\n", ""), "required with scheduler: slurm"),
    ],
)
def test_slurm_spec_mistakes_are_file_line_errors(text, expect):
    found = errors(text)
    assert any(expect in e for e in found), found


# ----------------------------------------------------------------------------- the plan


def plan_for(extra_slurm: str = "", extra: str = "", **kw):
    spec = load_spec_text(spec_text(extra_slurm, extra)).spec
    return spec, slurm_plan(spec, run_id="sl-1", **kw)


def test_the_plan_has_every_task_in_rank_order_without_a_tf_config():
    spec, plan = plan_for(extra="tensorflow: {chief: true}\n")
    again = plan_spec(load_spec_text(spec_text(extra="tensorflow: {chief: true}\n")), "sl-1")
    assert PlanRecord.from_plan(again).to_json() == PlanRecord.from_plan(plan).to_json()
    assert [str(n.task) for n in plan.nodes] == ["chief:0", "worker:0", "worker:1", "worker:2"]
    assert [n.host for n in plan.nodes] == ["node0", "node0", "node1", "node1"]
    assert all(Env.TF_CONFIG not in n.env and n.ssh is None for n in plan.nodes)
    assert all(n.node_config(0).cluster == {} for n in plan.nodes)  # the nodes build it: nothing to send
    assert {n.env[Env.NUM_TASKS] for n in plan.nodes} == {"4"}
    assert plan.nodes[0].argv == ("python3", "-m", "worker_entry", "slurm") and plan.chief.task.type == "chief"
    named = slurm_plan(spec, run_id="sl-1", node_names=["gpu-a1", "gpu-a2"])
    assert [n.host for n in named.nodes] == ["gpu-a1", "gpu-a1", "gpu-a2", "gpu-a2"]
    assert plan.extras["tf_port_base"] is None
    fixed = slurm_plan(load_spec_text(spec_text(extra="tensorflow: {port: 23000}\n")).spec, run_id="x")
    assert fixed.extras["tf_port_base"] == 23000


def test_sbatch_gets_every_option_as_one_argument_and_the_script_only_quoted_paths():
    spec, _ = plan_for("""\
        partition: gpu
        account: proj-1
        qos: high
        time: "1-00:00:00"
        constraint: a100&ib
        exclusive: true
        gpus_per_node: 4
        requeue: false
        signal_lead_s: 300
        extra_args: ["--mem=64G", "--mail-user=two words; $(reboot)"]
        """)
    argv = sbatch_argv(spec, "/runs/it's here", "/runs/it's here/slurm/job.sh", "sl-1")
    assert argv == [
        "sbatch",
        "--parsable",
        "--job-name=sl",
        "--comment=tfcluster:sl-1",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gpus-per-node=4",
        "--partition=gpu",
        "--account=proj-1",
        "--qos=high",
        "--time=1-00:00:00",
        "--constraint=a100&ib",
        "--exclusive",
        "--no-requeue",
        "--signal=B:USR2@300",
        "--output=/runs/it's here/slurm/slurm-%j.out",
        "--open-mode=append",
        "--mem=64G",
        "--mail-user=two words; $(reboot)",
        "/runs/it's here/slurm/job.sh",
    ]
    script = batch_script("/opt/py 3/bin/python", "/runs/it's here", "sl-1")
    exec_line = [line for line in script.splitlines() if not line.startswith("#")]
    assert len(exec_line) == 1
    assert shlex.split(exec_line[0]) == [
        "exec",
        "/opt/py 3/bin/python",
        "-m",
        "orchestrator",
        "slurm-batch",
        "/runs/it's here",
    ]
    assert "TFCLUSTER_SECRET" not in script


def test_srun_runs_one_block_step_that_slurm_kills_on_a_bad_exit():
    spec, plan = plan_for("gpus_per_node: 2\n")
    argv = srun_argv(spec, plan.nodes[0].argv, attempt=3)
    assert argv[:9] == [
        "srun",
        "--job-name=sl-a3",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--distribution=block",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--input=all",
    ]
    assert argv[-4:] == ["python3", "-m", "worker_entry", "slurm"] and "--gpus-per-node=2" in argv


def test_roles_are_ranked_by_role_and_a_restartable_role_keeps_the_step_up():
    """slurm.roles: ranks chief, workers, ps; the nodes get the counts (NodeConfig.roles, checked on
    receipt); a parameter-server worker may fail alone, so Slurm must not kill the step on a bad exit."""
    from worker_entry.protocol import NodeConfig, command_line

    text = spec_text("roles: {chief: 1, worker: 2, ps: 1}\n", "tensorflow: {strategy: parameter_server}\n")
    assert not errors(text)
    spec = load_spec_text(text).spec
    plan = slurm_plan(spec, run_id="sl-1")
    assert [str(n.task) for n in plan.nodes] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    assert [n.env[Env.IS_CHIEF] for n in plan.nodes] == ["1", "0", "0", "0"]
    config = NodeConfig.parse_line(command_line(plan.nodes[3].node_config(0)))
    assert config.roles == {"chief": 1, "worker": 2, "ps": 1} and str(config.task) == "ps:0"
    assert "--kill-on-bad-exit=0" in srun_argv(spec, plan.nodes[0].argv, attempt=0)
    mwms = load_spec_text(spec_text("roles: {chief: 1, worker: 3}\n")).spec
    assert "--kill-on-bad-exit=1" in srun_argv(mwms, plan.nodes[0].argv, attempt=0)  # every failure is fatal
    with_eval = load_spec_text(spec_text("roles: {worker: 3, evaluator: 1}\n")).spec
    assert "--kill-on-bad-exit=0" in srun_argv(
        with_eval, plan.nodes[0].argv, attempt=0
    )  # the evaluator is only reported
    restart = restart_srun_argv(spec, "python3", attempt=0, restart=2, node="n2", slug="worker-1")
    assert restart == [
        "srun",
        "--job-name=sl-a0-worker-1-r2",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n2",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--export=ALL",
        "--input=all",
        "python3",
        "-m",
        "worker_entry",
        "connect",
    ]


def test_plan_shows_the_sbatch_script_srun_and_how_tf_config_is_built():
    _, plan = plan_for()
    text = scheduler_named("slurm").describe(plan)
    assert "sbatch --parsable --job-name=sl" in text and "exec python3 -m orchestrator slurm-batch runs/sl-1" in text
    assert "srun --job-name=sl-a0" in text and "TF_CONFIG: built by each task" in text
    assert json.loads(PlanRecord.from_plan(plan).to_json())["slurm"]["ntasks"] == 4


def test_a_save_grace_longer_than_the_signal_lead_is_warned_about():
    spec = load_spec_text(
        spec_text("signal_lead_s: 5\n").replace(
            "  command: [python, train.py]\n", "  command: [python, train.py]\n  stop_grace_s: 30\n"
        )
    ).spec
    assert any("signal_lead_s" in w for w in slurm_plan(spec, run_id="x").warnings)


# ----------------------------------------------------------------------------- what Slurm prints


def test_job_ids_and_states_are_parsed_strictly():
    assert sc.parse_job_id("1234\n") == "1234" and sc.parse_job_id("77;cluster-a\n") == "77"
    for bad in ("", "Submitted batch job 5", "12; rm -rf /", "x" * 100):
        with pytest.raises(sc.SlurmError):
            sc.parse_job_id(bad)
    info = sc.parse_squeue("5", "RUNNING|None|n[1-3]|2:55|0:05\n")
    assert (info.state, info.nodes, info.time_left, info.active) == ("RUNNING", "n[1-3]", "2:55", True)
    assert sc.parse_squeue("5", "garbage") is None
    assert sc.parse_squeue("5", "\x1b[31mEVIL|a|b|c|d").state == "UNKNOWN"
    sco = sc.parse_scontrol_job(
        "5", "JobId=5 JobName=x JobState=CANCELLED Reason=None Restarts=2 NodeList=n1 ExitCode=0:15"
    )
    assert (sco.state, sco.restarts, sco.nodes, sco.active) == ("CANCELLED", 2, "n1", False)
    assert sc.parse_scontrol_job("5", "no state here") is None
    sa = sc.parse_sacct("5", "CANCELLED by 0|0:0|00:01:02|n[1-2]\n")
    assert (sa.state, sa.elapsed, sa.nodes) == ("CANCELLED", "00:01:02", "n[1-2]")
    assert JobInfo("5", "PENDING").active and not JobInfo("5", "TIMEOUT").active


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("55", 55),
        ("2:55", 175),
        ("1:00:00", 3600),
        ("2-01:00:00", 176400),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("", None),
        ("1:x", None),
        ("9" * 30, None),
    ],
)
def test_slurm_durations(text, seconds):
    assert sc.parse_duration(text) == seconds


def test_the_supervisor_advertises_the_batch_nodes_nodeaddr_or_its_route_to_the_first_node():
    assert advertise_address({"SLURMD_NODENAME": "n2"}, {"n2": "10.1.0.2"}) == "10.1.0.2"
    assert advertise_address({"SLURM_JOB_NODELIST": "n[1-3]"}, {"n1": "127.0.0.1"}) == "127.0.0.1"


# ----------------------------------------------------------------------------- the run's Slurm state


def test_the_state_file_is_private_and_read_tolerantly(tmp_path):
    run = RunDir.create(tmp_path / "run")
    SlurmState(run_id="r", job_ids=["12"], gather=False).save(run)
    assert (SlurmState.path(run).stat().st_mode & 0o077) == 0
    state = SlurmState.load(run)
    assert state.job_id == "12" and state.gather is False
    SlurmState.path(run).write_text(
        json.dumps(
            {"run_id": "r", "job_ids": ["1; reboot", 5, "7"], "preemptions": -3, "timeouts": True, "allocations": "x"}
        )
    )
    state = SlurmState.load(run)
    assert (state.job_ids, state.preemptions, state.timeouts, state.allocations) == (["7"], 0, 0, [])
    SlurmState.path(run).write_text("{not json")
    assert SlurmState.load(run) is None
    assert stop_requested(run) is None
    request_stop(run, "SIGINT", "test")
    assert stop_requested(run) == "SIGINT"


@pytest.fixture
def gone_run(tmp_path, monkeypatch):
    """A submitted run whose Slurm job is gone (state set per test), without result.json."""
    monkeypatch.setattr(vs, "SETTLE_S", 0.0)
    run = RunDir.create(tmp_path / "run")
    (run.path / "slurm").mkdir()
    run.plan_json.write_text(json.dumps({"job": "sl", "run_id": "sl-1", "scheduler": "slurm"}))
    SlurmState(run_id="sl-1", job_ids=["42"]).save(run)
    (run.path / "slurm" / "slurm-42.out").write_text("line one\npython3: No module named orchestrator\n")
    state = {"job": JobInfo("42", "FAILED")}
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: state["job"])
    return run, state


@pytest.mark.parametrize(
    ("slurm_state", "stop", "allocated", "expect"),
    [
        ("FAILED", None, False, JobState.START_FAILED),
        ("COMPLETED", None, True, JobState.FAILED),
        ("CANCELLED", None, True, JobState.INTERRUPTED_SIGTERM),
        ("CANCELLED", "SIGINT", False, JobState.INTERRUPTED_SIGINT),
        ("TIMEOUT", None, True, JobState.FAILED),
    ],
)
def test_a_run_whose_job_is_gone_gets_a_result_from_slurm_and_the_run_directory(
    gone_run, slurm_state, stop, allocated, expect
):
    run, state = gone_run
    state["job"] = JobInfo("42", slurm_state)
    if allocated:
        s = SlurmState.load(run)
        s.allocations.append({"job_id": "42", "restart": 0, "started_ts": 1.0})
        s.save(run)
    if stop:
        request_stop(run, stop, "test")
    assert vs.finalize(run)["state"] == expect.value
    result = json.loads(run.result_json.read_text())
    assert result["root_cause"]["kind"] == "scheduler" and "42" in result["root_cause"]["message"]
    assert "No module named orchestrator" in result["root_cause"]["hint"]
    assert json.loads(run.events_jsonl.read_text().splitlines()[-1])["event"] == "job_finished"
    assert vs.finalize(run)["state"] == expect.value  # idempotent: the result stays


def test_a_running_job_is_not_finalized(gone_run):
    run, state = gone_run
    state["job"] = JobInfo("42", "RUNNING")
    assert vs.finalize(run) is None and not run.is_finished()
    assert vs.supervisor_alive(run)


# ----------------------------------------------------------------------------- the supervisor's view of a signal


class _NoBackend:
    notes: list[str] = []
    transfers = True

    def bind_run(self, run_dir) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("first", "info", "stop", "expect"),
    [
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="1:55"), None, "timeout"),
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="5:00:00"), None, "preempted"),
        (signal.SIGUSR2, JobInfo("9", "UNKNOWN"), None, "timeout"),
        (signal.SIGTERM, JobInfo("9", "COMPLETING"), None, "preempted"),
        (signal.SIGTERM, JobInfo("9", "CANCELLED"), None, None),
        (signal.SIGTERM, JobInfo("9", "RUNNING"), "SIGTERM", None),
        (signal.SIGINT, JobInfo("9", "RUNNING"), None, None),
    ],
)
def test_the_supervisor_tells_an_ending_allocation_from_a_stop(tmp_path, monkeypatch, first, info, stop, expect):
    _ending(tmp_path, monkeypatch, first, info, stop, expect, batch=True)


@pytest.mark.parametrize(
    ("first", "info", "expect"),
    [
        (signal.SIGTERM, JobInfo("9", "RUNNING"), None),
        (signal.SIGTERM, JobInfo("9", "COMPLETING"), "preempted"),
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="1:00"), "timeout"),
    ],
)
def test_inside_the_users_allocation_a_sigterm_while_it_runs_is_a_stop(tmp_path, monkeypatch, first, info, expect):
    _ending(tmp_path, monkeypatch, first, info, None, expect, batch=False)


def _slurm_job(tmp_path, loaded, state, *, batch, env):
    from orchestrator.job import Job, LaunchOptions
    from orchestrator.schedulers.slurm.allocation import SlurmScheduling

    plan = slurm_plan(loaded.spec, run_id="sl-1")
    run = RunDir.create(tmp_path / "run")
    scheduling = SlurmScheduling(run, state, loaded.spec, batch=batch, env=env)
    job = Job(loaded, plan, LaunchOptions(live=False, echo_logs=False), _NoBackend(), scheduling=scheduling, rundir=run)
    return job, run, scheduling


def _ending(tmp_path, monkeypatch, first, info, stop, expect, batch):
    loaded = load_spec_text(spec_text())
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: info)
    job, run, scheduling = _slurm_job(
        tmp_path, loaded, SlurmState(run_id="sl-1"), batch=batch, env={"SLURM_JOB_ID": "9"}
    )
    if stop:
        request_stop(run, stop, "test")
    job.interrupt.trigger(first)
    job.interrupt.trigger(signal.SIGTERM)  # Slurm's SIGTERM after our USR2 does not change the reason
    assert scheduling.allocation_ending(job.interrupt) == expect
    job.bus.close()


def test_ctrl_c_asks_only_on_a_terminal():
    class Pipe:
        def isatty(self) -> bool:
            return False

    assert ask_cancel_or_detach(Pipe()) == "c"


# ----------------------------------------------------------------------------- teardown's last resort


def test_srun_still_running_after_the_teardown_gets_its_step_scancelled_then_killed(tmp_path, monkeypatch):
    import subprocess

    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    backend = st.SlurmStepBackend(spec, slurm_plan(spec, run_id="x"), log_dir=tmp_path, env={"SLURM_JOB_ID": "7"})
    calls = []
    monkeypatch.setattr(st, "SRUN_EXIT_WAIT_S", 0.1)
    monkeypatch.setattr(st, "SCANCEL_WAIT_S", 0.3)
    monkeypatch.setattr(sc, "steps_named", lambda job, name: calls.append(("steps", job, name)) or ["7.0"])
    monkeypatch.setattr(sc, "cancel", lambda target, **kw: calls.append(("scancel", target, kw)))
    backend.srun = subprocess.Popen(["sleep", "60"])  # an srun that does not end by itself
    backend.step_name = "sl-a0"
    backend.close()
    assert calls == [("steps", "7", "sl-a0"), ("scancel", "7.0", {"signal": "KILL"})]
    assert backend.srun.poll() is not None  # and killed when even that did not end it
    assert any("scancel --signal=KILL 7.0" in n for n in backend.notes) and any("killed" in n for n in backend.notes)


class _StuckSrun:
    """An srun that never ends by itself (its step has a node that cannot report): the waits it is given."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.killed = False

    def poll(self):
        return -9 if self.killed else None

    def wait(self, timeout=None):
        import subprocess

        if self.killed:
            return -9
        self.waits.append(timeout)
        raise subprocess.TimeoutExpired("srun", timeout)

    def kill(self) -> None:
        self.killed = True


def test_a_step_with_a_node_known_dead_is_scancelled_at_once_not_after_the_full_grace(tmp_path, monkeypatch):
    """The previous step's node n2 left the job for good (the next step runs without it: its task was
    judged lost for a host reason), or Slurm says n2 does not respond: srun would wait for a slurmstepd
    that cannot report, so the step is scancelled at once (in the background: scancel itself blocks while
    Slurm tries the dead node) and srun gets 1 s, not 5 + 10 s. A step whose nodes are all alive keeps
    the full grace."""
    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    cancelled: list[str] = []
    monkeypatch.setattr(sc, "steps_named", lambda job, name: ["7.0"] if name == "sl-a0" else [])
    monkeypatch.setattr(sc, "cancel", lambda target, **kw: cancelled.append(target))
    sinfo = {"out": "n1|mix\nn2|mix\n"}
    monkeypatch.setattr(sc, "run", lambda argv, **kw: sinfo["out"] if argv[0] == "sinfo" else "")

    def ended(left=(), sinfo_out="n1|mix\nn2|mix\n") -> tuple[list[float], list[str]]:
        sinfo["out"] = sinfo_out
        backend = st.SlurmStepBackend(spec, slurm_plan(spec, run_id="x"), log_dir=tmp_path, env=env)
        backend.srun, backend.step_name, backend._step_hosts = _StuckSrun(), "sl-a0", ("n1", "n2")
        srun = backend.srun
        backend._end_step(left=left)
        assert srun.killed
        backend.close()  # reaps a scancel left in the background
        assert cancelled.pop() == "7.0" and not any(t.is_alive() for t in backend._cancels)
        return srun.waits, backend.notes

    waits, notes = ended(left=["n2"])  # left the job for good: not even the quick wait
    assert waits == [st.DEAD_NODE_SCANCEL_WAIT_S]
    assert "srun was still running after the teardown (node n2 known dead: its srun cannot report)" in notes[0]
    waits, notes = ended(sinfo_out="n1|mix\nn2|mix*\n")  # Slurm: n2 not responding
    assert waits == [st.SRUN_QUICK_EXIT_S, st.DEAD_NODE_SCANCEL_WAIT_S] and "node n2 known dead" in notes[0]
    waits, notes = ended()  # every node alive: the full grace, as before
    assert waits == [st.SRUN_QUICK_EXIT_S, st.SRUN_EXIT_WAIT_S - st.SRUN_QUICK_EXIT_S, st.SCANCEL_WAIT_S]
    assert "known dead" not in notes[0]


def test_a_step_left_on_slurms_books_by_a_dead_node_is_overlapped_not_waited_for(tmp_path, monkeypatch):
    """A node that stopped answering keeps the previous attempt's step on Slurm's books (until it is
    marked DOWN): the next step would wait for that step's CPUs ("Requested nodes are busy"), so it is
    started with --overlap, and the run is told why. A step that ended normally changes nothing."""
    import subprocess

    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    plan = slurm_plan(spec, run_id="x")
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(argv, **kw):
        started.append(list(argv))
        return real_popen(["true"], **kw)

    monkeypatch.setattr(st.subprocess, "Popen", popen)
    monkeypatch.setattr(sc, "node_addrs", lambda nodelist: "")
    starts = [(n, n.node_config(1)) for n in plan.nodes]
    for books, overlap in ((["7.0"], True), ([], False)):
        monkeypatch.setattr(sc, "steps_named", lambda job, name, books=books: list(books) if name == "sl-a0" else [])
        backend = st.SlurmStepBackend(spec, plan, log_dir=tmp_path, env=env)
        backend.step_name = "sl-a0"  # the previous attempt's step (its srun is gone)
        backend.launch(starts)
        assert ("--overlap" in started[-1]) is overlap, started[-1]
        assert any("7.0" in n and "--overlap" in n for n in backend.notes) is overlap, backend.notes
        backend.close()
    assert srun_argv(spec, plan.nodes[0].argv, attempt=1, overlap=True)[-5] == "--overlap"
    assert "--overlap" not in srun_argv(spec, plan.nodes[0].argv, attempt=1)


# ----------------------------------------------------------------------------- requeue caps and resubmission


def _job(tmp_path, monkeypatch, *, requeue=True, state=None):
    loaded = load_spec_text(spec_text(f"requeue: {str(requeue).lower()}\nmax_requeues: 2\n"))
    state = state or SlurmState(run_id="sl-1", job_ids=["9"])
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: JobInfo("9", "RUNNING", time_left="1:00"))
    job, run, _ = _slurm_job(tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9"})
    run.slurm_dir.mkdir()
    state.allocations.append({"job_id": "9", "restart": 0, "started_ts": 1.0})  # this allocation (open())
    job.interrupt.trigger(signal.SIGUSR2)
    return job, run


def _end_allocation(job):
    """The attempt the USR2 interrupted, concluded by the job's policy; then the job's one end."""
    from orchestrator.core.result import AttemptResult

    job.result.become(JobState.STARTING)  # the attempt ran
    decision = job.conclude(AttemptResult(0, JobState.INTERRUPTED_SIGTERM, 1.0, 2.0, {}))
    return job.end(decision)


def test_past_the_cap_a_time_out_ends_the_run(tmp_path, monkeypatch):
    job, run = _job(tmp_path, monkeypatch, state=SlurmState(run_id="sl-1", job_ids=["9"], timeouts=2))
    requeued = []
    monkeypatch.setattr(sc, "requeue", requeued.append)
    res = _end_allocation(job)
    assert requeued == [] and res.state == JobState.FAILED
    assert "3 time-outs, more than slurm.max_requeues (2)" in res.root_cause.message
    assert json.loads(run.result_json.read_text())["state"] == "failed"


def test_where_requeue_is_refused_the_job_is_resubmitted_after_this_one(tmp_path, monkeypatch):
    job, run = _job(tmp_path, monkeypatch)
    (run.path / "slurm" / "sbatch.json").write_text(json.dumps(["sbatch", "--parsable", "--job-name=sl", "/r/job.sh"]))

    def refuse(job_id):
        raise sc.SlurmError("scontrol failed (exit 1): Requested operation is presently disabled")

    submitted = []
    monkeypatch.setattr(sc, "requeue", refuse)
    monkeypatch.setattr(sc, "submit", lambda argv, env=None: submitted.append(argv) or "10")
    res = _end_allocation(job)
    assert res.state == JobState.REQUEUED and not run.result_json.exists()
    assert submitted == [["sbatch", "--parsable", "--job-name=sl", "--dependency=afterany:9", "/r/job.sh"]]
    state = SlurmState.load(run)
    assert state.job_ids == ["9", "10"] and (state.timeouts, state.preemptions, state.requeues) == (1, 0, 1)
    kinds = [json.loads(line)["event"] for line in run.events_jsonl.read_text().splitlines()]
    assert "requeued" in kinds
    assert json.loads((run.path / "status.json").read_text())["state"] == "requeued"


def test_with_requeue_off_the_time_limit_ends_the_run(tmp_path, monkeypatch):
    job, _ = _job(tmp_path, monkeypatch, requeue=False)
    res = _end_allocation(job)
    assert res.state == JobState.FAILED and "slurm.requeue is false" in res.root_cause.message


def test_an_allocation_whose_supervisor_died_is_an_attempt_of_its_own(tmp_path, monkeypatch):
    """SIGKILLed with its allocation (a node failure, a requeue past KillWait): the next supervisor
    records that allocation as a requeued attempt, counts a preemption, and continues the numbering."""
    loaded = load_spec_text(spec_text())
    earlier = {
        "attempt": 0,
        "state": "requeued",
        "started_ts": 1.0,
        "ended_ts": 2.0,
        "tasks": {},
        "failures": [{"kind": "scheduler", "message": "time limit", "ts": 2.0}],
    }
    state = SlurmState(
        run_id="sl-1",
        job_ids=["9"],
        timeouts=1,
        attempts=[earlier],
        allocations=[
            {"job_id": "9", "restart": 0, "started_ts": 1.0, "ended_ts": 2.0, "end": "timeout"},
            {"job_id": "9", "restart": 1, "started_ts": 3.0},
        ],
    )
    job, _, scheduling = _slurm_job(
        tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "2"}
    )
    assert scheduling.open(job)  # it continues a run
    assert [a.state for a in job.result.attempts] == [JobState.REQUEUED, JobState.REQUEUED]
    assert "ended without its supervisor recording it" in job.result.attempts[1].root_cause.message
    assert all(t.state.value == "lost" for t in job.result.attempts[1].tasks.values())
    assert (len(job.result.attempts), state.preemptions, state.timeouts) == (2, 1, 1)
    assert job.result.started_ts == 1.0  # the run's wall time counts from its first allocation
    job.bus.close()


def _submitted(tmp_path, monkeypatch, extra: str = "  env: {API_TOKEN: s3cr3t-value}\n", command=None):
    """submit() with sbatch replaced by a recorder: the run directory and what sbatch was given."""
    from orchestrator.schedulers.slurm import submit as sub

    calls = []
    monkeypatch.setattr(sub.sc, "have", lambda name: True)
    monkeypatch.setattr(sub.sc, "submit", lambda argv, env=None: calls.append((list(argv), env)) or "77")
    loaded = load_spec_text(spec_text(extra=extra), "/home/me/spec.yaml")
    plan = plan_spec(loaded, "sl-1")
    done = sub.submit(loaded, plan, str(tmp_path / "run"), command)
    return done.rundir, calls


def test_the_spec_travels_to_the_batch_job_in_a_private_file_not_in_its_environment(tmp_path, monkeypatch):
    """Slurm stores a job's environment (slurmctld's state, `sacct --env-vars`): the credentials go in
    RUN/slurm/private-spec.json (0600) instead, which the batch job reads, and the run's end removes."""
    from orchestrator.schedulers.slurm.private_spec import read_private_spec

    rundir, calls = _submitted(tmp_path, monkeypatch, command=["python", "other.py", "--fast"])
    ((argv, env),) = calls
    assert env is None or not any("s3cr3t-value" in v for v in env.values())
    assert not any("s3cr3t-value" in a for a in argv)
    private = rundir.slurm_private_spec
    assert private.stat().st_mode & 0o077 == 0 and "s3cr3t-value" in private.read_text()
    assert "s3cr3t-value" not in rundir.spec_yaml.read_text()
    back = read_private_spec(rundir)
    assert back.spec.job.command == ["python", "other.py", "--fast"] and back.path == "/home/me/spec.yaml"
    assert back.spec.job.env["API_TOKEN"] == "s3cr3t-value"


def test_without_its_private_spec_the_batch_job_refuses_to_run(tmp_path, monkeypatch):
    """Never the redacted copy: it would run with `<redacted>` as the credentials."""
    from orchestrator.schedulers.slurm import batch

    rundir, _ = _submitted(tmp_path, monkeypatch)
    rundir.slurm_private_spec.unlink()
    started = []
    monkeypatch.setattr(batch, "Job", lambda *a, **k: started.append(a))
    result = batch.run_batch(str(rundir.path), env={"SLURM_JOB_ID": "77"})
    assert started == [] and result.state == JobState.START_FAILED
    stored = json.loads(rundir.result_json.read_text())
    assert stored["state"] == "start_failed" and "private-spec.json is missing" in stored["root_cause"]["message"]


@pytest.mark.parametrize("damage", ["garbled", "group-writable", "foreign"])
def test_a_private_spec_another_user_could_have_written_is_refused(tmp_path, monkeypatch, damage):
    import os

    from orchestrator.schedulers.slurm.private_spec import PrivateSpecMissing, read_private_spec

    if damage == "foreign" and os.geteuid() != 0:
        pytest.skip("needs root: a file owned by another user")
    rundir, _ = _submitted(tmp_path, monkeypatch)
    path = rundir.slurm_private_spec
    if damage == "garbled":
        path.write_text("[1, 2]")
    elif damage == "group-writable":
        path.chmod(0o620)
    else:
        os.chown(path, 65534, 65534)
    with pytest.raises(PrivateSpecMissing, match=r"damaged|not a private file"):
        read_private_spec(rundir)


# ----------------------------------------------------------------------------- a requeue after the training completed


def _attempt(states, state=JobState.INTERRUPTED_SIGTERM, failures=()):
    from orchestrator.core.result import AttemptResult, TaskResult
    from orchestrator.core.states import TaskState

    tasks = {
        f"worker:{i}": TaskResult(f"worker:{i}", f"n{i + 1}", TaskState(s), exit_code=0 if s == "succeeded" else None)
        for i, s in enumerate(states)
    }
    return AttemptResult(0, state, 1.0, 2.0, tasks, list(failures))


@pytest.mark.parametrize(
    ("states", "expect"),
    [
        (["succeeded", "succeeded"], "completed"),
        (["succeeded", "stopped"], "requeue"),
        (["stopped", "stopped"], "requeue"),
    ],
)
def test_tasks_that_exit_0_during_a_preemption_completed_their_training(tmp_path, monkeypatch, states, expect):
    """SIGTERM from Slurm (a requeue) while every task finished its last epoch and exited 0: the run is
    done (a requeue would train again from epoch 0: BackupAndRestore removed its backup)."""
    from orchestrator.job import Action

    loaded = load_spec_text(spec_text())
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: JobInfo("9", "COMPLETING"))
    job, _, scheduling = _slurm_job(tmp_path, loaded, SlurmState(run_id="sl-1"), batch=True, env={"SLURM_JOB_ID": "9"})
    job.interrupt.trigger(signal.SIGTERM)
    decision = scheduling.policy(loaded.spec).decide(_attempt(states), [], job.interrupt)
    if expect == "completed":
        assert decision.action is Action.FINISH and decision.ended_by is None
        assert "completed its training" in decision.completed and "not requeued" in decision.completed
        res = _attempt(states)
        job.policy = scheduling.policy(loaded.spec)
        job.result.become(JobState.STARTING)  # the attempt ran
        job.conclude(res)
        assert res.state == JobState.SUCCEEDED and job.result.state == JobState.SUCCEEDED
    else:
        assert decision.action is Action.REQUEUE and decision.completed is None
    job.bus.close()


@pytest.mark.parametrize(
    ("earlier", "status", "expect"),
    [
        ("recorded", None, True),  # the last allocation recorded a requeue although every task had exited 0
        ("lost", ["succeeded"] * 4, True),  # its supervisor died unrecorded; its last status says it all
        ("lost", ["succeeded"] * 3 + ["running"], False),
        ("lost", None, False),
    ],
)
def test_a_requeued_allocation_whose_tasks_all_completed_finishes_at_once(tmp_path, earlier, status, expect):
    """The next allocation reads the earlier attempts (slurm.json; for a supervisor that died unrecorded,
    its last status.json): every task completed → nothing to run, the run succeeds, saying so."""
    loaded = load_spec_text(spec_text())
    state = SlurmState(run_id="sl-1", job_ids=["9"], allocations=[{"job_id": "9", "restart": 0, "started_ts": 1.0}])
    if earlier == "recorded":
        rec = _attempt(["succeeded"] * 4, JobState.REQUEUED, [])
        state.attempts = [rec.to_dict()]
        state.allocations[0].update(ended_ts=2.0, end="preempted")
    job, run, scheduling = _slurm_job(
        tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"}
    )
    if status is not None:
        tasks = {f"worker:{i}": {"state": st} for i, st in enumerate(status)}
        run.status_json.write_text(json.dumps({"attempt": 0, "tasks": tasks}))
    scheduling.open(job)
    said = scheduling.completed_earlier(job)
    assert (said is not None) == expect, said
    if expect:
        assert "nothing is left to run" in said
    job.bus.close()
