"""The gate before the go: every task that holds it up, then every node's facts compared (versions, Keras,
GPUs, ports, clocks, disk).

MWMS cannot recover from a version mismatch or a busy port once TensorFlow started, so a blocking
finding stops the job before any training command runs (nothing ran: exit code 4).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence, Set

from ..core.result import Failure
from ..core.states import TaskState
from ..events import EventBus
from ..events.kinds import HeterogeneousGpus, Preflight
from ..plan import Plan
from ..spec import ClusterSpec
from .checks import evaluate, failed
from .session import TaskSession

_NOT_UP = (TaskState.PENDING, TaskState.STARTING)


def check_before_go(
    ready: Sequence[TaskSession], spec: ClusterSpec, plan: Plan, bus: EventBus, *, report: bool, attempt: int
) -> Failure | None:
    """Evaluate the cross-host checks; emit the ``preflight`` event (when ``report``); the failure
    that must stop the job, or None."""
    facts = {s.task: s.facts for s in ready if s.facts is not None}
    # a pod's hello is from its container's start, not an answer to us: no skew can be read from it
    skews = {s.task: s.skew_s for s in ready if s.skew_s is not None and getattr(s.channel, "times_hello", False)}
    findings = evaluate(
        facts,
        {s.task: s.host for s in ready},
        legacy_keras=spec.tensorflow.legacy_keras,
        gpus=plan.nodes[0].gpus,
        skews=skews,
    )
    blocking = [f for f in findings if f.blocks]
    warnings = [f for f in findings if failed(f) and not f.blocks]
    for f in findings:
        if f.code == "gpus" and failed(f):
            bus.emit(HeterogeneousGpus(message=f.message))
    if not report:
        return None
    bus.emit(
        Preflight(
            ok=not blocking,
            summary="; ".join(f"{f.task or 'all'}: {f.message}" for f in blocking + warnings),
            findings=[f.to_dict() for f in findings if failed(f)],
            warnings=len(warnings),
        )
    )
    if not blocking:
        return None
    first = blocking[0]
    msg = "; ".join(
        f"{f.task or 'all'} ({f.host or '-'}): {f.message}" + (f" — fix: {f.hint}" if f.hint else "") for f in blocking
    )
    return Failure("preflight", msg, time.time(), first.task, first.host, attempt=attempt)


class GoGate:
    """When the go is sent: once every task whose role holds it (not a sidecar evaluator: it gets its
    go when it is up) said hello and the cross-host checks pass; a failure naming the tasks that did not
    report by the startup deadline, or the checks' blocking finding."""

    def __init__(
        self,
        spec: ClusterSpec,
        plan: Plan,
        bus: EventBus,
        holds_go: Set[str],
        *,
        report: bool,
        attempt: int,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.bus = bus
        self.holds_go = holds_go
        self.report = report
        self.attempt = attempt
        self._order: list[str] | None = None  # the tasks that hold the go, in plan order
        self._up_to = 0  # every task of ``_order`` before this index was seen up at the last look

    def _all_up(self, sessions: Mapping[str, TaskSession]) -> bool:
        """Whether every task that holds the go seems up, looked at from where the last look stopped:
        tasks come up, in any order, one batch at a time, and a scan from the first task at every batch
        was O(N²) over a start (0.6 s of CPU at 4,096 tasks). A task seen up that went back (a restart)
        is caught by the full scan that follows a yes."""
        if self._order is None:
            self._order = [t for t in sessions if t in self.holds_go]
        order, i = self._order, self._up_to
        while i < len(order) and sessions[order[i]].state not in _NOT_UP:
            i += 1
        self._up_to = i
        return i == len(order)

    def decide(
        self, now: float, deadline: float, sessions: Mapping[str, TaskSession]
    ) -> list[TaskSession] | Failure | None:
        """The tasks to give the go to now; the failure that stops the job; None: not yet (``deadline``:
        for every hello, job.startup_timeout_s after the attempt started them)."""
        if now < deadline and not self._all_up(sessions):
            return None  # not yet: no scan of every task per batch while they come
        waiting = [s for t, s in sessions.items() if s.state in _NOT_UP and t in self.holds_go]
        waiting.sort(key=lambda s: s.state != TaskState.PENDING)  # never dialed: blamed before one slow to say hello
        if waiting and now < deadline:
            self._up_to = 0  # one went back: look again from the first
            return None
        if waiting:
            names = ", ".join(s.task for s in waiting)
            msg = f"worker_entry did not report within {self.spec.job.startup_timeout_s:g}s on {names}"
            first = waiting[0]
            return Failure("startup_timeout", msg, time.time(), first.task, first.host, attempt=self.attempt)
        ready = [s for s in sessions.values() if s.state == TaskState.READY]
        failure = check_before_go(ready, self.spec, self.plan, self.bus, report=self.report, attempt=self.attempt)
        return failure if failure is not None else ready or None
