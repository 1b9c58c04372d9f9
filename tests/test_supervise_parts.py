"""The decision loop's collaborators on their own (pure or nearly): what a failure does by role and
budget (``tolerance``), the order in which channels that closed early are decided (``closed``), the
stop orders of the launcher's signals (``teardown.Interrupts``) and the go gate's three answers."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from fakenode import FakeChannel, make_plan

from orchestrator.core.result import Failure
from orchestrator.core.states import TaskState
from orchestrator.plan.roles import rule_of
from orchestrator.supervise import Interrupt, TaskSession
from orchestrator.supervise.closed import EOF_STATUS_S, ClosedChannels
from orchestrator.supervise.gate import GoGate
from orchestrator.supervise.teardown import Interrupts
from orchestrator.supervise.tolerance import tolerate

PS = "parameter_server"
MWMS = "multi_worker_mirrored"


def _failure(task: str | None = "worker:1", kind: str = "exit") -> Failure:
    return Failure(kind, "exited with code 1", 1.0, task, "h")


def _judge(task: str, strategy: str, *, kind: str = "exit", **kw):
    args = {
        "stopping": False,
        "went": True,
        "restarts": 0,
        "limit": 2,
        "restarts_tasks": True,
        "replaces_sidecars": False,
        **kw,
    }
    return tolerate(_failure(task, kind), rule_of(strategy, task), **args)


def test_a_role_that_takes_the_job_down_and_every_failure_while_stopping_are_the_jobs():
    assert _judge("worker:0", MWMS).action == "teardown"  # an MWMS worker: the collective is gone
    assert _judge("ps:0", PS).action == "teardown"
    assert _judge("worker:1", PS, stopping=True).action == "teardown"  # the teardown already runs
    assert _judge("worker:1", PS, went=False).action == "teardown"  # before the go a restart waits for nothing
    for kind in ("preflight", "connect", "restart"):  # the host or the spec is wrong, not the task
        assert _judge("worker:1", PS, kind=kind).action == "teardown"
    budget = {"restarts": 0, "limit": 2, "restarts_tasks": True, "replaces_sidecars": False}
    assert tolerate(_failure(None), None, stopping=False, went=True, **budget).action == "teardown"  # the job's own


def test_a_ps_worker_is_restarted_within_its_budget_and_fails_the_job_past_it_saying_why():
    d = _judge("worker:1", PS, restarts=1)
    assert (d.action, d.restarts, d.failure.message) == ("restart", 2, "exited with code 1")
    d = _judge("worker:1", PS, restarts=2)
    assert d.action == "teardown"
    assert d.failure.message == "exited with code 1 (restarted 2 time(s) already: restart.max_task_restarts 2)"
    d = _judge("worker:1", PS, restarts_tasks=False)
    assert (d.action, d.failure.message) == ("teardown", "exited with code 1 (this scheduler cannot restart one task)")


def test_a_sidecar_is_reported_and_its_replacements_followed_within_the_budget():
    assert (_judge("evaluator:0", MWMS).action, _judge("evaluator:0", MWMS).restarts) == ("report", 0)
    d = _judge("evaluator:0", MWMS, replaces_sidecars=True, restarts=1)
    assert (d.action, d.restarts) == ("restart", 2)  # Kubernetes starts it again: followed
    d = _judge("evaluator:0", MWMS, replaces_sidecars=True, restarts=2)
    assert (d.action, d.restarts) == ("report", 2)
    assert d.failure.message.endswith(
        "(its replacements are not followed: restarted 2 time(s), restart.max_task_restarts 2)"
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sessions(n: int) -> list[TaskSession]:
    _, plan = make_plan(n)
    out = []
    for node in plan.nodes:
        s = TaskSession(node)
        s.attach(FakeChannel())
        out.append(s)
    return out


def test_closed_channels_are_decided_in_the_order_they_closed_each_once_its_status_came():
    clock = _Clock()
    a, b = _sessions(2)
    closed = ClosedChannels(clock)
    closed.add(a)
    closed.add(b)
    never = lambda s: False  # noqa: E731
    b.channel.status = 0  # the later one's status came first: it still waits behind the earlier one
    assert list(closed.due(never, clock())) == []
    a.channel.status = 127
    assert [(s.task, st) for s, _, st in closed.due(never, clock())] == [("worker:0", 127), ("worker:1", 0)]
    assert not closed


def test_a_closed_channel_waits_for_its_status_until_its_deadline_or_a_decision():
    clock = _Clock()
    (a,) = _sessions(1)
    closed = ClosedChannels(clock)
    closed.add(a)
    never = lambda s: False  # noqa: E731
    clock.now += EOF_STATUS_S / 2
    assert list(closed.due(never, clock())) == []  # its status may still come
    clock.now += EOF_STATUS_S
    assert [(s.task, stopped, st) for s, stopped, st in closed.due(never, clock())] == [("worker:0", False, None)]
    closed.add(a)
    assert [s.task for s, _, _ in closed.due(never)] == ["worker:0"]  # a decision comes: decided now
    closed.add(a)
    assert [stopped for _, stopped, _ in closed.due(lambda s: True, clock())] == [
        True
    ]  # told to stop: no status needed


def test_a_closed_channel_is_not_decided_within_the_decision_about_an_earlier_one():
    clock = _Clock()
    a, b = _sessions(2)
    closed = ClosedChannels(clock)
    closed.add(a)
    closed.add(b)
    order = []
    for s, _, _ in closed.due(lambda s: False):
        order.append(s.task)
        order += [f"nested {t.task}" for t, _, _ in closed.due(lambda s: False)]  # a decision asks again
    assert order == ["worker:0", "worker:1"]


def test_interrupts_become_stop_orders_forwarding_the_signal_and_a_second_one_kills_now():
    interrupt = Interrupt()
    orders = Interrupts(interrupt)
    assert orders.order() is None
    interrupt.trigger(signal.SIGINT)
    first = orders.order()
    assert (first.reason, first.signum, first.grace, orders.by) == ("interrupted by SIGINT", signal.SIGINT, None, 2)
    assert first.announce.signal == "SIGINT"
    assert orders.order() is None  # once per signal
    interrupt.trigger(signal.SIGTERM)
    second = orders.order()
    assert (second.grace, second.signum, second.announce) == (0, signal.SIGTERM, None)
    assert second.reason == "interrupted again by SIGTERM: killing now" and orders.by == signal.SIGINT


@pytest.mark.parametrize("up", [0, 1, 2])
def test_the_go_gate_waits_for_every_hello_then_goes_or_names_who_never_came(up):
    loaded, plan = make_plan(2)
    sessions = {str(n.task): TaskSession(n) for n in plan.nodes}
    for s in list(sessions.values())[:up]:
        s.attach(FakeChannel())
        s.become(TaskState.READY)
    gate = GoGate(loaded.spec, plan, None, set(sessions), report=False, attempt=0)  # type: ignore[arg-type]
    now = time.monotonic()
    before = gate.decide(now, now + 5, sessions)
    after = gate.decide(now + 5, now + 5, sessions)
    if up == 2:
        assert [s.task for s in before] == ["worker:0", "worker:1"]
    else:
        assert before is None
        assert after.kind == "startup_timeout" and after.task == f"worker:{up}"
        assert after.message.endswith(", ".join(f"worker:{i}" for i in range(up, 2)))


def _release(sessions) -> None:
    """The fake channels' pipes closed (FakeChannel.close only tells the node): hundreds of sessions must
    not leave their descriptors to the rest of the suite (select() refuses a descriptor past 1,023)."""
    for s in sessions:
        ch = s.channel
        if ch is not None:
            for fd in (ch._r, ch._w, ch._er, ch._ew):
                with contextlib.suppress(OSError):
                    os.close(fd)


class _CountingSessions(dict):
    """A task → session map that counts how many sessions the gate looked at."""

    looked = 0

    def __getitem__(self, task):
        self.looked += 1
        return super().__getitem__(task)

    def items(self):
        for t, s in super().items():
            self.looked += 1
            yield t, s


def test_the_go_gate_looks_at_each_task_a_bounded_number_of_times_over_a_start_in_any_order():
    """Tasks come up one batch at a time: each batch's look starts where the last one stopped (a scan
    from the first task at every batch was O(N²) over a start of thousands)."""
    n = 300
    loaded, plan = make_plan(n)
    sessions = _CountingSessions({str(node.task): TaskSession(node) for node in plan.nodes})
    gate = GoGate(loaded.spec, plan, None, set(sessions), report=False, attempt=0)  # type: ignore[arg-type]
    now = time.monotonic()
    order = list(dict.values(sessions))
    try:
        for s in order[: n // 2] + order[n // 2 :][::-1]:  # half in plan order, the rest backwards
            assert gate.decide(now, now + 60, sessions) is None
            s.attach(FakeChannel())
            s.become(TaskState.READY)
        go = gate.decide(now, now + 60, sessions)
    finally:
        _release(order)
    assert [s.task for s in go] == [str(node.task) for node in plan.nodes]
    assert sessions.looked <= 5 * n  # the old scan: ~n²/4 here (22,500)


def test_a_task_that_went_back_after_the_gate_saw_it_up_holds_the_go_and_is_named_at_the_deadline():
    loaded, plan = make_plan(3)
    sessions = {str(n.task): TaskSession(n) for n in plan.nodes}
    gate = GoGate(loaded.spec, plan, None, set(sessions), report=False, attempt=0)  # type: ignore[arg-type]
    now = time.monotonic()
    for s in list(sessions.values())[:2]:
        s.attach(FakeChannel())
        s.become(TaskState.READY)
    assert gate.decide(now, now + 5, sessions) is None  # worker:2 not up; worker:0 and 1 seen up
    replaced = sessions["worker:0"]
    sessions["worker:0"] = TaskSession(plan.nodes[0])  # replaced (a restart in place): not up any more
    last = sessions["worker:2"]
    last.attach(FakeChannel())
    last.become(TaskState.READY)
    assert gate.decide(now, now + 5, sessions) is None  # not a go: worker:0 is starting again
    late = gate.decide(now + 5, now + 5, sessions)
    assert late.kind == "startup_timeout" and late.task == "worker:0"
    sessions["worker:0"].attach(FakeChannel())
    sessions["worker:0"].become(TaskState.READY)
    assert [s.task for s in gate.decide(now, now + 5, sessions)] == ["worker:0", "worker:1", "worker:2"]
    _release([*sessions.values(), replaced])
