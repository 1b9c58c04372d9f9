"""A job that outlives its hosts (issue 34), unit tier: the spec's fields, the policy's table (which
failure blames the host, what the next attempt's shape is), and the job over fake nodes speaking the
real protocol: a lost host replaced by a spare, a job shrunk to ``min_workers``, a script that raised
restarted in place, a host unreachable at the restart left out."""

from __future__ import annotations

import json
import time

import pytest
from fakenode import FakeBackend, FakeNode, healthy, lost_for_good, make_plan
from waiting import wait_for

from orchestrator.core.diagnostics import Diagnostic
from orchestrator.core.result import AttemptResult, Failure, TaskResult
from orchestrator.core.states import JobState
from orchestrator.job import Action, Exclusion, Job, LaunchOptions, Members, RestartPolicy
from orchestrator.job.policy import host_to_blame
from orchestrator.runs import RunDir, read_plan
from orchestrator.schedulers.ssh import SCHEDULER
from orchestrator.spec import load_spec_text
from orchestrator.supervise import Interrupt
from worker_entry import protocol as p

# --- the spec ---------------------------------------------------------------------------------------

HOSTS = "hosts:\n  - {address: a}\n  - {address: b}\n  - {address: c}\n"


def _problems(body: str) -> list[str]:
    from orchestrator.core.errors import SpecError

    text = "version: 1\nname: t\njob: {command: [train]}\nssh: {config_file: null}\n" + body
    try:
        loaded = load_spec_text(text, "s.yaml")
    except SpecError as exc:
        return [str(d) for d in exc.diagnostics]
    return [str(w) for w in loaded.warnings]


def test_min_workers_is_checked_against_the_planned_workers_at_its_line():
    (msg,) = _problems(HOSTS + "  - {address: d, spare: true}\nrestart: {min_workers: 4}\n")
    assert msg.startswith("s.yaml:10: restart.min_workers: 4 is more than the 3 planned workers")
    assert "allowed: 1 to 3" in msg
    assert _problems(HOSTS + "restart: {min_workers: 3}\n") == []
    (zero,) = _problems(HOSTS + "restart: {min_workers: 0}\n")
    assert "restart.min_workers" in zero and "greater than or equal to 1" in zero


def test_spare_hosts_take_a_lost_hosts_roles_under_mwms_and_a_host_left_to_run():
    assert _problems("hosts:\n  - {address: a, roles: {chief: 1, worker: 1}}\n  - {address: b, spare: true}\n") == []
    (roles,) = _problems("hosts:\n  - {address: a}\n  - {address: b, spare: true, roles: {worker: 1}}\n")
    assert roles.startswith("s.yaml:7: hosts[1].roles: a spare host has no roles of its own: it takes the tasks")
    # a spare may take a host's 2 tasks: 2 TF ports, the next one another host's on the same machine
    (ports,) = _problems(
        "hosts:\n  - {address: 127.0.0.1, roles: {worker: 2}, tf_port: 5000}\n"
        "  - {address: 127.0.0.2, tf_port: 6001}\n  - {address: 127.0.0.3, spare: true, tf_port: 6000}\n"
    )
    assert "hosts[2].tf_port: TF port 6001 is already used by hosts[1] on the same machine" in ports
    assert "a spare takes one port per task of the host it replaces" in ports
    (every,) = _problems("hosts:\n  - {address: a, spare: true}\n")
    assert "every host is a spare" in every
    # that one error, not a second saying min_workers 1 exceeds "the 0 planned workers"
    (every,) = _problems("hosts:\n  - {address: a, spare: true}\nrestart: {min_workers: 1}\n")
    assert "every host is a spare" in every
    ps = _problems(
        "hosts:\n  - {address: a}\n  - {address: b, spare: true}\n"
        "tensorflow: {strategy: parameter_server}\nrestart: {min_workers: 1}\n"
    )
    assert any("hosts[1].spare: spare hosts need tensorflow.strategy: multi_worker_mirrored" in m for m in ps)
    assert any("restart.min_workers: reshaping to fewer workers needs" in m for m in ps)


def test_slurm_spare_nodes_are_validated_and_used_with_several_tasks_per_node_and_roles():
    base = "scheduler: slurm\nslurm: {nodes: 2, spare_nodes: %s}\n"
    assert _problems(base % "1") == []  # used: no warning
    (bad,) = _problems(base % "-1")
    assert "slurm.spare_nodes" in bad
    (too_many,) = _problems("scheduler: slurm\nslurm: {nodes: 2, tasks_per_node: 2}\nrestart: {min_workers: 5}\n")
    assert "5 is more than the 4 planned workers" in too_many
    assert _problems("scheduler: slurm\nslurm: {nodes: 2, tasks_per_node: 2, spare_nodes: 1}\n") == []
    assert _problems("scheduler: slurm\nslurm: {nodes: 3}\nrestart: {min_workers: 2}\n") == []
    roles = "scheduler: slurm\nslurm: {nodes: 2, spare_nodes: 1, roles: {chief: 1, worker: 1}}\n"
    assert _problems(roles) == []
    (fixed,) = _problems(roles + "restart: {min_workers: 1}\n")
    assert "restart.min_workers: warning: not used by this job: slurm.roles fill the step exactly" in fixed


def test_the_plan_leaves_the_spares_out_and_lists_them():
    doc_hosts = [{"address": f"10.0.0.{i + 1}"} for i in range(4)]
    doc_hosts[1]["spare"] = True
    _, plan = make_plan(4, hosts=doc_hosts, ssh={"config_file": None})
    assert [n.host for n in plan.nodes] == ["10.0.0.1", "10.0.0.3", "10.0.0.4"]
    assert plan.spares == ("10.0.0.2",) and plan.planned_workers == 3
    assert plan.common.env[p.Env.NUM_WORKERS] == "3" and plan.common.env[p.Env.PLANNED_WORKERS] == "3"


# --- the policy's table -----------------------------------------------------------------------------


def _failed(kind: str, task: str = "worker:2", host: str = "c", more: tuple[Failure, ...] = ()) -> AttemptResult:
    rc = Failure(kind, f"{task} {kind}", 100.0, task, host)
    tasks = {f"worker:{i}": TaskResult(f"worker:{i}", "abc"[i]) for i in range(3)}
    return AttemptResult(0, JobState.FAILED, 0.0, 1.0, tasks, [rc, *more])


ELASTIC = Members(("a", "b", "c"), ("worker:0", "worker:1", "worker:2"), ("d",), 3, 3, reshapes=True)


@pytest.mark.parametrize(
    ("kind", "blamed"),
    [
        ("lost", True),
        ("hung", True),
        ("connect", True),
        ("preflight", True),
        ("exit", False),  # the script raised: restart in place
        ("signal", False),  # killed by a signal we did not send (the OOM killer): not the host's fault
        ("stalled", False),
        ("startup_timeout", False),
        ("straggler", False),
        ("protocol", False),
    ],
)
def test_only_a_host_reason_blames_the_root_causes_host(kind, blamed):
    out = host_to_blame(_failed(kind))
    assert (out is not None) == blamed
    decision = RestartPolicy(2).decide(_failed(kind), [], Interrupt(), ELASTIC)
    assert decision.action is (Action.RESHAPE if blamed else Action.RESTART)
    if blamed:
        assert out is not None and (out.host, out.task, out.ts) == ("c", "worker:2", 100.0)


def test_the_victims_are_never_blamed_and_a_gpu_fault_is_the_hosts():
    victims = (Failure("lost", "UnavailableError", 101.0, "worker:0", "a"),)
    assert host_to_blame(_failed("exit", more=victims)) is None  # the root cause raised; a peer lost after it
    out = host_to_blame(_failed("exit"), frozenset({"worker:2"}))
    assert out is not None and out.host == "c" and out.reason.startswith("GPU fault on worker:2")
    assert host_to_blame(_failed("exit"), frozenset({"worker:1"})) is None  # another task's GPU: not this one


def test_a_spare_takes_the_lost_hosts_place_and_its_task_index():
    d = RestartPolicy(2).decide(_failed("lost", "worker:1", "b"), [], Interrupt(), ELASTIC)
    assert d.action is Action.RESHAPE and d.restarts and d.reshape is not None
    r = d.reshape
    assert (r.out.host, r.spare_in, r.workers_before, r.workers_after) == ("b", "d", 3, 3)
    assert r.after.hosts == ("a", "d", "c") and r.after.spares == () and r.after.excluded == (r.out,)


def test_without_a_spare_the_job_shrinks_to_min_workers_then_ends_saying_why():
    shrinkable = Members(("a", "b", "c"), ("worker:0", "worker:1", "worker:2"), (), 3, 2, reshapes=True)
    d = RestartPolicy(3).decide(_failed("lost"), [], Interrupt(), shrinkable)
    assert d.action is Action.RESHAPE and d.reshape is not None
    assert (d.reshape.spare_in, d.reshape.workers_after, d.reshape.after.hosts) == (None, 2, ("a", "b"))
    at_min = Members(("a", "b"), ("worker:0", "worker:1"), (), 3, 2, reshapes=True)
    end = RestartPolicy(3).decide(_failed("lost", "worker:1", "b"), [], Interrupt(), at_min)
    assert end.action is Action.FINISH and end.run_failure is not None
    assert "no spare host is left: 1 worker(s) would remain, below restart.min_workers (2)" in end.run_failure.message


def test_a_reshape_counts_against_the_budget_and_a_job_without_spares_restarts_in_place():
    spent = [_failed("lost"), _failed("exit")]
    assert RestartPolicy(2).decide(_failed("lost"), spent, Interrupt(), ELASTIC).action is Action.FINISH
    plain = Members(("a", "b", "c"), ("worker:0", "worker:1", "worker:2"), (), 3, 3, reshapes=True)
    assert not plain.elastic  # no spare, min_workers = planned: as before issue 34
    assert RestartPolicy(2).decide(_failed("lost"), [], Interrupt(), plain).action is Action.RESTART
    no_replan = Members(("a", "b", "c"), ("worker:0", "worker:1", "worker:2"), ("d",), 3, 3, reshapes=False)
    assert RestartPolicy(2).decide(_failed("lost"), [], Interrupt(), no_replan).action is Action.RESTART
    stopped = Interrupt()
    stopped.count = 1
    assert RestartPolicy(2).decide(_failed("lost"), [], stopped, ELASTIC).action is Action.FINISH


def test_the_spares_used_up_the_next_lost_host_ends_the_run_saying_why():
    """Its last spare in, the job is still elastic: a second lost host ends the run with the reason
    (before: a restart in place on the lost host, whose connect then failed)."""
    d = RestartPolicy(5).decide(_failed("lost", "worker:1", "b"), [], Interrupt(), ELASTIC)
    assert d.reshape is not None and d.reshape.after.spares == () and d.reshape.after.elastic
    after = d.reshape.after
    end = RestartPolicy(5).decide(_failed("lost", "worker:0", "a"), [], Interrupt(), after)
    assert end.action is Action.FINISH and end.run_failure is not None
    assert "no spare host is left: 2 worker(s) would remain, below restart.min_workers (3)" in end.run_failure.message


def test_members_find_the_culprit_by_its_task_and_name_it_by_their_host():
    got = ELASTIC.without(Exclusion("10.9.9.9:22", "connect: refused", 1, 5.0, "worker:0"))
    assert not isinstance(got, str)
    _, reshape = got
    assert reshape.out.host == "a" and reshape.after.hosts == ("d", "b", "c")
    assert "is not one of the job's hosts" in str(ELASTIC.without(Exclusion("zz", "lost", 0)))


# --- the job over fake nodes -----------------------------------------------------------------------


def _hosts(n: int, spares: tuple[int, ...] = ()) -> list[dict]:
    return [{"address": f"10.0.0.{i + 1}", **({"spare": True} if i in spares else {})} for i in range(n)]


def _job(tmp_path, scripts_for, backend_cls=FakeBackend, **sections):
    loaded, plan = make_plan(ssh={"config_file": None}, **sections)
    tasks = [f"worker:{i}" for i in range(len(plan.nodes) + len(plan.spares))]
    backend = backend_cls({t: scripts_for for t in tasks})
    opts = LaunchOptions(run_dir=str(tmp_path / "r"), gather=False, live=False, echo_logs=False)
    job = Job(loaded, plan, opts, backend, scheduling=SCHEDULER.scheduling(loaded, plan))
    return job.run(), backend, tmp_path / "r"


def _events(run_dir, kind):
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_a_lost_host_is_replaced_by_the_spare_on_a_new_plan(tmp_path, capsys):
    result, backend, run_dir = _job(
        tmp_path, lost_for_good("10.0.0.3"), hosts=_hosts(4, spares=(3,)), restart={"max_restarts": 1}
    )
    assert result.state == JobState.SUCCEEDED and len(result.attempts) == 2
    assert result.attempts[0].root_cause.kind == "lost" and result.attempts[0].root_cause.host == "10.0.0.3"
    second = [n for n in backend.history if n.config.attempt == 1]
    assert sorted((str(n.node.task), n.node.host) for n in second) == [
        ("worker:0", "10.0.0.1"),
        ("worker:1", "10.0.0.2"),
        ("worker:2", "10.0.0.4"),  # the spare, in the lost host's place and index
    ]
    cluster = second[0].config.cluster["worker"]
    assert cluster == ["10.0.0.1:12345", "10.0.0.2:12345", "10.0.0.4:12345"]  # TF_CONFIG rebuilt
    assert all(n.config.env[p.Env.NUM_WORKERS] == "3" and n.config.env[p.Env.ATTEMPT] == "1" for n in second)
    (reshaped,) = _events(run_dir, "reshaped")
    assert (reshaped["host"], reshaped["task"], reshaped["spare_in"]) == ("10.0.0.3", "worker:2", "10.0.0.4")
    assert (reshaped["workers_before"], reshaped["workers_after"], reshaped["spares_left"]) == (3, 3, 0)
    assert reshaped["reason"].startswith("lost: ") and reshaped["attempt"] == 1
    record = read_plan(RunDir(run_dir))
    assert record is not None and record.attempt == 1 and record.spares == ()
    assert [t.host for t in record.tasks] == ["10.0.0.1", "10.0.0.2", "10.0.0.4"]
    (change,) = record.reshapes
    assert (change.out, change.spare_in, change.hosts_before["worker:2"]) == ("10.0.0.3", "10.0.0.4", "10.0.0.3")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["elastic"]["excluded"][0]["host"] == "10.0.0.3" and status["elastic"]["spares"] == []
    # what the console, `status` and `report` say of it
    said = capsys.readouterr().err
    assert "host 10.0.0.3 (worker:2) is out for good (lost: " in said
    assert "spare 10.0.0.4 takes its place: 3 -> 3 workers, 0 spare(s) left" in said
    from orchestrator.views.control import job_status, status_text
    from orchestrator.views.report import build_report, report_text

    text = status_text(job_status(RunDir(run_dir)))
    assert "host excluded: 10.0.0.3 (worker:2, attempt 0): lost: " in text
    assert "spares left: none   workers: 3 of 3 planned" in text
    rep = build_report(RunDir(run_dir))
    (r,) = rep.reshapes
    assert (r["host"], r["spare_in"], r["attempt"]) == ("10.0.0.3", "10.0.0.4", 1)
    assert r["loss_to_training_s"] is not None and 0 <= r["loss_to_training_s"] < 60
    assert "10.0.0.3 (worker:2) out — lost: " in report_text(rep) and "spare 10.0.0.4 in" in report_text(rep)


def test_without_a_spare_the_job_goes_on_with_min_workers(tmp_path):
    result, backend, run_dir = _job(
        tmp_path, lost_for_good("10.0.0.2"), hosts=_hosts(3), restart={"max_restarts": 2, "min_workers": 2}
    )
    assert result.state == JobState.SUCCEEDED
    second = sorted((str(n.node.task), n.node.host, n.config) for n in backend.history if n.config.attempt == 1)
    assert [(t, h) for t, h, _ in second] == [("worker:0", "10.0.0.1"), ("worker:1", "10.0.0.3")]  # dense
    assert all(c.env[p.Env.NUM_WORKERS] == "2" and c.env[p.Env.PLANNED_WORKERS] == "3" for _, _, c in second)
    assert second[0][2].cluster == {"worker": ["10.0.0.1:12345", "10.0.0.3:12345"]}
    (reshaped,) = _events(run_dir, "reshaped")
    assert (reshaped["spare_in"], reshaped["workers_after"]) == (None, 2)


def test_below_min_workers_the_run_ends_failed_saying_why(tmp_path):
    result, _, run_dir = _job(
        tmp_path,
        lost_for_good("10.0.0.2", ("10.0.0.3", 1)),
        hosts=_hosts(3),
        restart={"max_restarts": 3, "min_workers": 2},
    )
    assert result.state == JobState.FAILED and len(result.attempts) == 2
    assert len(_events(run_dir, "reshaped")) == 1  # 3 -> 2, then 2 -> 1 is below min_workers
    assert any("below restart.min_workers (2)" in f.message for f in result.failures)


def test_a_script_that_raised_restarts_in_place_and_no_host_is_excluded(tmp_path):
    def raises_first(n: FakeNode) -> None:
        healthy(0.3, code=1 if (n.node.host, n.config.attempt) == ("10.0.0.2", 0) else 0)(n)

    result, backend, run_dir = _job(tmp_path, raises_first, hosts=_hosts(4, spares=(3,)), restart={"max_restarts": 1})
    assert result.state == JobState.SUCCEEDED and len(result.attempts) == 2
    assert result.attempts[0].root_cause.kind == "exit"
    assert sorted(n.node.host for n in backend.history if n.config.attempt == 1) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert _events(run_dir, "reshaped") == []
    status = json.loads((run_dir / "status.json").read_text())
    assert status["elastic"] == {"excluded": [], "spares": ["10.0.0.4"], "workers": 3, "planned_workers": 3}


class _HostGoesDown(FakeBackend):
    """10.0.0.2 answers the first connect only (then it is gone for good)."""

    def connect(self, nodes):
        self.calls = getattr(self, "calls", 0) + 1
        down = {"10.0.0.2"} if self.calls > 1 else set()
        return [
            Diagnostic(f"timeout on {n.host}", task=str(n.task), host=n.host, code="timeout")
            for n in nodes
            if n.host in down
        ]


def test_a_host_unreachable_at_the_restart_is_left_out(tmp_path):
    def raises_first(n: FakeNode) -> None:
        healthy(0.3, code=1 if n.config.attempt == 0 and n.node.task.index == 0 else 0)(n)

    result, backend, run_dir = _job(
        tmp_path, raises_first, _HostGoesDown, hosts=_hosts(4, spares=(3,)), restart={"max_restarts": 1}
    )
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert sorted(n.node.host for n in backend.history if n.config.attempt == 1) == ["10.0.0.1", "10.0.0.3", "10.0.0.4"]
    (reshaped,) = _events(run_dir, "reshaped")
    assert reshaped["host"] == "10.0.0.2" and reshaped["reason"].startswith("connect: timeout")
    wait_for(lambda: backend.closed, 5, "the backend closed")
    assert time.time() - reshaped["lost_ts"] < 120


def test_the_batch_rule_keeps_the_planned_global_batch_on_fewer_workers():
    from worker_entry import reshaped_batch_size

    env = {p.Env.NUM_WORKERS: "2", p.Env.PLANNED_WORKERS: "3"}
    assert reshaped_batch_size(64, env) == 96  # 3 x 64 = 192 global, over 2 workers
    assert reshaped_batch_size(64, {p.Env.NUM_WORKERS: "3", p.Env.PLANNED_WORKERS: "3"}) == 64
    assert reshaped_batch_size(64, {}) == 64  # not under tfcluster: as given
    assert reshaped_batch_size(64, {p.Env.NUM_WORKERS: "x", p.Env.PLANNED_WORKERS: "3"}) == 64


def test_preflight_checks_the_spares_like_any_host(monkeypatch):
    from orchestrator.schedulers.ssh import preflight

    seen = []
    monkeypatch.setattr(preflight, "run_preflight", lambda spec, plan: seen.append(plan) or "report")
    loaded, plan = make_plan(4, hosts=_hosts(4, spares=(1,)), ssh={"config_file": None})
    assert SCHEDULER.preflight(loaded, plan) == "report"
    (checked,) = seen
    assert sorted(n.host for n in checked.nodes) == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
