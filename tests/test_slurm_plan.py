"""Slurm without a Slurm: the spec rules, the plan (sbatch, script, srun), parsing what Slurm prints,
the run's Slurm state and ending a run whose job is gone."""

from __future__ import annotations

import json
import shlex

import pytest
from slurm_specs import errors, spec_text

from orchestrator.core.states import JobState
from orchestrator.plan.record import PlanRecord
from orchestrator.runs import RunDir
from orchestrator.schedulers import plan_spec, scheduler_named
from orchestrator.schedulers.slurm import commands as sc
from orchestrator.schedulers.slurm import handle as vs
from orchestrator.schedulers.slurm.commands import JobInfo
from orchestrator.schedulers.slurm.plan import batch_script, restart_srun_argv, sbatch_argv, slurm_plan, srun_argv
from orchestrator.schedulers.slurm.state import SlurmState, request_stop, stop_requested
from orchestrator.schedulers.slurm.step import advertise_address
from orchestrator.spec import load_spec_text
from worker_entry.protocol.env import Env

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
