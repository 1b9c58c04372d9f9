"""A reshape of any shape (issue 34): a host with several tasks lost for good takes all of them out (or
a spare takes them all), the chief is kept while its host lives and a worker takes it when it does not,
the sidecar evaluator and ps tasks move to a spare or the run ends saying why. Unit tier: the policy's
table, the SSH planner's new plan (task indices dense, ports, TF_CONFIG rebuilt), and the job over fake
nodes speaking the real protocol."""

from __future__ import annotations

import json

from fakenode import FakeBackend, lost_for_good, make_plan

from orchestrator.core.states import JobState
from orchestrator.job import Exclusion, Job, LaunchOptions, Members
from orchestrator.schedulers.ssh import SCHEDULER
from worker_entry import protocol as p

#: a: chief + worker, b: two workers, c: a worker and the sidecar evaluator
TASKS = ("chief:0", "worker:0", "worker:1", "worker:2", "worker:3", "evaluator:0")
PLACED = ("a", "a", "b", "b", "c", "c")


def _members(spares: tuple[str, ...] = (), min_workers: int = 5, tasks=TASKS, placed=PLACED) -> Members:
    return Members(tuple(dict.fromkeys(placed)), tasks, spares, 5, min_workers, reshapes=True, task_hosts=placed)


def _lose(members: Members, task: str):
    return members.without(Exclusion("?", "lost: silent", 0, 1.0, task))


def test_a_host_with_two_workers_leaves_with_both_or_the_spare_takes_both():
    nxt, r = _lose(_members(min_workers=3), "worker:2")
    assert (r.out.host, r.spare_in, r.workers_before, r.workers_after) == ("b", None, 5, 3)
    assert nxt.hosts == ("a", "c") and nxt.workers == 3
    assert nxt.roles_of("a") == (("chief", 1), ("worker", 1))  # the chief kept: its host is alive
    nxt, r = _lose(_members(("d",)), "worker:1")
    assert (r.spare_in, r.workers_after, nxt.hosts) == ("d", 5, ("a", "d", "c"))
    assert nxt.roles_of("d") == (("worker", 2),) and nxt.spares == ()
    assert "3 worker(s) would remain, below restart.min_workers (5)" in str(_lose(_members(), "worker:1"))


def test_the_chiefs_host_lost_a_worker_or_the_spare_takes_the_chief():
    nxt, r = _lose(_members(min_workers=3), "chief:0")
    assert (r.out.host, r.workers_after, nxt.hosts) == ("a", 3, ("b", "c"))
    assert nxt.roles_of("b") == (("chief", 1), ("worker", 1))  # the first host left with a worker
    assert nxt.roles_of("c") == (("worker", 1), ("evaluator", 1))
    nxt, r = _lose(_members(("d",)), "worker:0")  # the chief's host, found by another of its tasks
    assert r.out.host == "a" and nxt.hosts == ("d", "b", "c") and nxt.roles_of("d") == (("chief", 1), ("worker", 1))
    only_chief = _members(min_workers=1, tasks=("chief:0", "evaluator:0"), placed=("a", "b"))
    assert "0 worker(s) would remain" in str(_lose(only_chief, "chief:0"))


def test_the_evaluator_and_ps_tasks_move_to_a_spare_or_the_run_ends_saying_why():
    why = _lose(_members(min_workers=1), "evaluator:0")
    assert why == (
        "host c is out (lost: silent) and no spare host is left to take the sidecar evaluator (worker:3, "
        "evaluator:0): only a spare host takes it over; add a spare host"
    )
    nxt, r = _lose(_members(("d",)), "evaluator:0")
    assert r.spare_in == "d" and nxt.roles_of("d") == (("worker", 1), ("evaluator", 1))
    ps = _members(min_workers=1, tasks=("chief:0", "worker:0", "ps:0"), placed=("a", "b", "c"))
    assert "parameter-server training cannot lose a ps, its variables live there" in str(_lose(ps, "ps:0"))
    nxt, _ = _lose(ps.__class__(**{**ps.__dict__, "spares": ("d",)}), "ps:0")
    assert nxt.roles_of("d") == (("ps", 1),)
    fixed = Members(("a", "b"), ("worker:0", "worker:1"), (), 2, 1, reshapes=True, fixed="roles fill the step")
    assert str(_lose(fixed, "worker:1")).endswith("no spare host is left: roles fill the step")


# --- the SSH planner's new plan ---------------------------------------------------------------------

ROLES = [
    {"address": "10.0.0.1", "roles": {"chief": 1, "worker": 1}},
    {"address": "10.0.0.2", "roles": {"worker": 2}},
    {"address": "10.0.0.3", "roles": {"worker": 1}},
]


def _plan(spare: bool, **restart):
    hosts = [*ROLES, {"address": "10.0.0.4", "spare": True}] if spare else ROLES
    return make_plan(hosts=hosts, ssh={"config_file": None}, restart={"max_restarts": 2, **restart})


def _replan(loaded, plan, task: str):
    from orchestrator.job.reshaping import members_of

    sch = SCHEDULER.scheduling(loaded, plan)
    members = members_of(plan, loaded.spec, sch.reshapes)
    nxt, reshape = members.without(Exclusion("?", "lost", 0, 1.0, task))
    return sch.replan(plan, nxt), reshape


def test_the_spare_takes_the_lost_hosts_two_workers_their_indices_and_two_ports():
    loaded, plan = _plan(True)
    assert plan.members == ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.3")
    new, r = _replan(loaded, plan, "worker:2")
    assert (r.out.host, r.spare_in, r.workers_after) == ("10.0.0.2", "10.0.0.4", 5)
    assert [(str(n.task), n.host, n.tf_port) for n in new.nodes] == [
        ("chief:0", "10.0.0.1", 12345),
        ("worker:0", "10.0.0.1", 12346),
        ("worker:1", "10.0.0.4", 12345),
        ("worker:2", "10.0.0.4", 12346),
        ("worker:3", "10.0.0.3", 12345),
    ]
    assert new.common.cluster == {
        "chief": ["10.0.0.1:12345"],
        "worker": ["10.0.0.1:12346", "10.0.0.4:12345", "10.0.0.4:12346", "10.0.0.3:12345"],
    }
    assert new.spares == () and new.common.env[p.Env.NUM_WORKERS] == "5"


def test_without_a_spare_the_chiefs_host_lost_a_worker_is_the_chief_on_fewer_workers():
    loaded, plan = _plan(False, min_workers=2)
    new, r = _replan(loaded, plan, "chief:0")
    assert (r.out.host, r.workers_after) == ("10.0.0.1", 3)
    assert [(str(n.task), n.host, n.tf_port) for n in new.nodes] == [
        ("chief:0", "10.0.0.2", 12345),
        ("worker:0", "10.0.0.2", 12346),
        ("worker:1", "10.0.0.3", 12345),
    ]
    assert new.common.env[p.Env.NUM_WORKERS] == "3" and new.common.env[p.Env.PLANNED_WORKERS] == "5"
    assert new.members == ("10.0.0.2", "10.0.0.2", "10.0.0.3")


# --- the job over fake nodes -----------------------------------------------------------------------


def test_a_host_with_two_tasks_lost_for_good_reshapes_the_job_over_fake_nodes(tmp_path, capsys):
    loaded, plan = _plan(False, min_workers=2)
    script = lost_for_good("10.0.0.2")
    backend = FakeBackend({t: script for t in ("chief:0", *(f"worker:{i}" for i in range(4)))})
    opts = LaunchOptions(run_dir=str(tmp_path / "r"), gather=False, live=False, echo_logs=False)
    result = Job(loaded, plan, opts, backend, scheduling=SCHEDULER.scheduling(loaded, plan)).run()
    assert result.state == JobState.SUCCEEDED and len(result.attempts) == 2, result.root_cause
    assert result.attempts[0].root_cause.host == "10.0.0.2"
    second = sorted((str(n.node.task), n.node.host) for n in backend.history if n.config.attempt == 1)
    assert second == [("chief:0", "10.0.0.1"), ("worker:0", "10.0.0.1"), ("worker:1", "10.0.0.3")]
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    (reshaped,) = [e for e in events if e["event"] == "reshaped"]
    assert (reshaped["host"], reshaped["workers_before"], reshaped["workers_after"]) == ("10.0.0.2", 5, 3)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["elastic"]["workers"] == 3 and status["elastic"]["planned_workers"] == 5
    assert "no spare left: 2 worker(s) fewer: 5 -> 3 workers" in capsys.readouterr().err
