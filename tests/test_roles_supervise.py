"""Supervision per role (plan.roles: the table), through the real supervisor and in-process
fake nodes: a parameter-server worker is restarted alone and in place, the ps or the chief dying is
fatal with it as root cause, the job ends when the chief ends (the rest stopped: a success); an MWMS
sidecar evaluator never holds the go, never fails the training, and is stopped when training ends."""

from __future__ import annotations

import json

from fakenode import FakeNode, healthy, obedient
from supervising import Recorder
from supervising import supervise as supervise_fakes
from waiting import wait_for

from orchestrator.core.states import JobState, TaskState
from orchestrator.plan.roles import RULES, rule_of
from worker_entry import protocol as p

PS_HOSTS = [
    {"address": "10.0.0.1", "roles": {"chief": 1}},
    {"address": "10.0.0.2", "roles": {"worker": 2}},
    {"address": "10.0.0.3", "roles": {"ps": 1}},
]
EVAL_HOSTS = [
    {"address": "10.0.0.1", "roles": {"worker": 1}},
    {"address": "10.0.0.2", "roles": {"worker": 1}},
    {"address": "10.0.0.3", "roles": {"evaluator": 1}},
]


def supervise(scripts, hosts, strategy="multi_worker_mirrored", rec=None, **sections):
    """test_supervisor's real supervisor over fake nodes, on hosts with roles."""
    return supervise_fakes(scripts, hosts=hosts, tensorflow={"strategy": strategy}, rec=rec, **sections)


def killed(n: FakeNode) -> None:
    """Starts, runs a little, then dies of SIGKILL (not from us)."""
    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=77))
    n.heartbeat(state="running")
    n.clock.advance(0.1)
    n.exited(None, signal=9, signal_name="SIGKILL")


def first_time(script, then=obedient):
    """``script`` for the first incarnation, ``then`` for every restart."""
    calls = []

    def run(n: FakeNode) -> None:
        calls.append(n)
        (script if len(calls) == 1 else then)(n)

    return run


def test_the_table_covers_every_role_each_strategy_allows():
    from orchestrator.spec.roles import ALLOWED

    assert {s: set(r) for s, r in RULES.items()} == {s: set(r) for s, r in ALLOWED.items()}
    assert rule_of("parameter_server", "worker:3").on_failure == "restart"
    assert rule_of("parameter_server", "ps:0").on_failure == "teardown"
    assert rule_of("multi_worker_mirrored", "evaluator:0").on_failure == "report"


def test_ps_worker_killed_is_restarted_in_place_and_the_job_succeeds_when_the_chief_ends():
    scripts = {"chief:0": healthy(1.0), "worker:1": first_time(killed)}
    res, rec, backend = supervise(scripts, PS_HOSTS, "parameter_server")
    assert res.state == JobState.SUCCEEDED and res.root_cause is None
    (rf,) = rec.kinds("role_failure")
    assert (rf.task, rf.role, rf.kind, rf.action, rf.restarts) == ("worker:1", "worker", "signal", "restart", 1)
    again = [n for n in backend.history if n.task == "worker:1"]
    assert len(again) == 2 and again[1].config.remote_dir.endswith("attempt-0-restart-1")
    assert any(isinstance(c, p.Go) for c in again[1].received)  # the go as soon as it said hello
    (end,) = rec.kinds("training_ended")
    assert end.stopping == 3
    states = {t: r.state for t, r in res.tasks.items()}
    assert states == {
        "chief:0": TaskState.SUCCEEDED,
        "worker:0": TaskState.STOPPED,
        "worker:1": TaskState.STOPPED,
        "ps:0": TaskState.STOPPED,
    }


def test_ps_killed_tears_the_job_down_with_the_ps_as_root_cause():
    res, rec, _ = supervise({"chief:0": obedient, "ps:0": killed}, PS_HOSTS, "parameter_server")
    assert res.state == JobState.FAILED
    assert (res.root_cause.task, res.root_cause.kind, res.root_cause.signal) == ("ps:0", "signal", "SIGKILL")
    assert not rec.kinds("role_failure") and not rec.kinds("training_ended")


def test_a_worker_past_its_restart_budget_fails_the_job():
    res, rec, backend = supervise(
        {"chief:0": obedient, "worker:0": killed}, PS_HOSTS, "parameter_server", restart={"max_task_restarts": 1}
    )
    assert res.state == JobState.FAILED and res.root_cause.task == "worker:0"
    assert "restarted 1 time(s) already: restart.max_task_restarts 1" in res.root_cause.message
    assert [e.restarts for e in rec.kinds("role_failure")] == [1]
    assert len([n for n in backend.history if n.task == "worker:0"]) == 2


def test_a_stopped_ps_worker_is_stopped_and_restarted():
    def sigstopped(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.run_until_stopped(state="stopped")

    res, rec, backend = supervise(
        {"chief:0": healthy(1.5), "worker:0": first_time(sigstopped)}, PS_HOSTS, "parameter_server"
    )
    assert res.state == JobState.SUCCEEDED
    (rf,) = rec.kinds("role_failure")
    assert (rf.task, rf.kind, rf.action) == ("worker:0", "hung", "restart")
    first = next(n for n in backend.history if n.task == "worker:0")
    assert any(isinstance(c, p.Stop) for c in first.received) or first.eof  # told to stop, its channel closed


def test_the_evaluator_never_holds_the_go_and_its_failure_is_only_reported():
    rec = Recorder()

    def late_and_failing(n: FakeNode) -> None:
        wait_for(lambda: len(rec.kinds("task_spawned")) == 2, 10, "both workers started without it")
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=9))
        n.exited(1, error="evaluator crashed")

    scripts = {"worker:0": healthy(1.0), "worker:1": healthy(1.0), "evaluator:0": late_and_failing}
    res, rec, _ = supervise(scripts, EVAL_HOSTS, rec=rec)
    assert res.state == JobState.SUCCEEDED and res.root_cause is None
    (rf,) = rec.kinds("role_failure")
    assert (rf.task, rf.kind, rf.action) == ("evaluator:0", "exit", "report")
    assert res.tasks["evaluator:0"].state == TaskState.FAILED
    spawned = [e.task for e in rec.kinds("task_spawned")]
    ready = [e.task for e in rec.kinds("task_ready")]
    assert ready.index("evaluator:0") == 2 and spawned.index("evaluator:0") == 2  # the workers went first


def test_the_evaluator_is_not_judged_as_a_worker_and_is_stopped_when_training_ends():
    def evaluates(n: FakeNode) -> None:  # never reports a step, a strategy or a TF server
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=9))
        n.run_until_stopped()
        n.exited(None, signal=15, signal_name="SIGTERM", stopped=True)

    scripts = {"worker:0": healthy(1.2), "worker:1": healthy(1.2), "evaluator:0": evaluates}
    res, rec, _ = supervise(scripts, EVAL_HOSTS, job={"startup_timeout_s": 0.5})
    assert res.state == JobState.SUCCEEDED, res.root_cause
    assert not rec.kinds("startup_timeout")
    (end,) = rec.kinds("training_ended")
    assert end.stopping == 1 and "evaluator:0" in end.message
    assert res.tasks["evaluator:0"].state == TaskState.STOPPED


def test_a_restarted_worker_has_the_startup_deadline_to_say_hello():
    def slow_start(n: FakeNode) -> None:
        n.let_pass(1.5)  # past heartbeat.timeout_s (1.0), within job.startup_timeout_s (5)
        obedient(n)

    res, rec, backend = supervise(
        {"chief:0": healthy(3.0), "worker:1": first_time(killed, then=slow_start)}, PS_HOSTS, "parameter_server"
    )
    assert res.state == JobState.SUCCEEDED, res.root_cause
    assert [e.restarts for e in rec.kinds("role_failure")] == [1] and not rec.kinds("worker_lost")
    assert len([n for n in backend.history if n.task == "worker:1"]) == 2


def _node_built_tf_config(scripts, *, lie: str | None = None):
    """A PS job whose nodes build their own TF_CONFIG (as under Slurm: the plan's env has none) and
    report their endpoint in their hello; ``lie``: worker:0 reports this instead."""
    from fakenode import FakeBackend, make_plan
    from supervising import Recorder, build_supervisor

    loaded, plan = make_plan(hosts=PS_HOSTS, tensorflow={"strategy": "parameter_server"})
    object.__setattr__(plan.common, "node_builds_cluster", True)  # no cluster in the NodeConfigs: as under Slurm
    assert all(not n.node_config(0).cluster for n in plan.nodes)
    backend, rec = FakeBackend(scripts, endpoints={"worker:0": lie} if lie else None), Recorder()
    sup = build_supervisor(loaded, plan, backend, rec)
    try:
        return sup.run(), rec, backend, plan
    finally:
        backend.close()


def test_a_restart_of_a_task_whose_node_built_its_tf_config_gets_the_cluster_the_nodes_reported():
    scripts = {"chief:0": healthy(1.0), "worker:1": first_time(killed)}
    res, _rec, backend, plan = _node_built_tf_config(scripts)
    assert res.state == JobState.SUCCEEDED
    again = [n for n in backend.history if n.task == "worker:1"][1].config
    expected = {
        "cluster": plan.nodes[0].tf_config["cluster"],
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
    }
    assert p.Env.TF_CONFIG not in again.env and again.cluster == expected["cluster"]  # worker_entry builds it:
    assert json.loads(again.tf_config_json()) == expected
    assert again.tf_port == int(expected["cluster"]["worker"][1].rsplit(":", 1)[1])  # its old port


def test_a_node_that_reported_garbage_as_its_endpoint_fails_the_restart_at_once_with_why():
    scripts = {"chief:0": healthy(3.0), "worker:1": first_time(killed)}
    res, rec, _backend, _plan = _node_built_tf_config(scripts, lie="10.0.0.2:1; rm -rf /")
    assert res.state == JobState.FAILED
    rc = res.root_cause
    assert (rc.kind, rc.task) == ("restart", "worker:1")
    assert (
        rc.message == "cannot restart worker:1 in place: cannot rebuild TF_CONFIG: worker:0 never said where it listens"
    )
    assert [e.restarts for e in rec.kinds("role_failure")] == [1]  # no retry: none could mend it
