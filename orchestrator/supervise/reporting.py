"""What an attempt reports as it goes: the status snapshot (``on_status``: status.json, the live table,
the metrics) with the connections the backend refused, and those refusals as events (the first at
once, then at most one per 10 s, the rest at the attempt's end: ``backends.refusals``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends import Backend
from ..core.states import JobState
from ..events import EventBus
from ..events import kinds as ev
from .monitor import Monitor
from .status import Snapshots

OnStatus = Callable[[dict[str, Any]], None]


class Reporter:
    def __init__(
        self, snapshots: Snapshots, monitor: Monitor, backend: Backend, bus: EventBus, *, attempt: int
    ) -> None:
        self.snapshots = snapshots
        self.monitor = monitor
        self.backend = backend
        self.bus = bus
        self.attempt = attempt

    def status(self, state: JobState, stopping_reason: str | None) -> dict[str, Any]:
        """The snapshot now: every task's entry (``Snapshots``: only those touched are rebuilt), the
        monitor's judgements, the refused connections."""
        status = self.snapshots.build(
            state=state,
            attempt=self.attempt,
            stopping_reason=stopping_reason,
            straggler=self.monitor.straggler,
            gpu_problems=self.monitor.gpus.judgement.by_task(),
            scores=self.monitor.scores,
        )
        if (refusals := self.backend.refusals()) is not None:
            status["refused_connections"] = refusals.summary()
        return status

    def publish(
        self, on_status: OnStatus | None, state: JobState, stopping_reason: str | None, *, final: bool = False
    ) -> None:
        refusals = self.backend.refusals()
        if refusals is not None and (r := refusals.report(final=final)) is not None:  # rate-limited, not at the end
            self.bus.emit(ev.ConnectionRefused(peer=r.peer, reason=r.reason, count=r.count, total=r.total))
        if on_status is not None:
            on_status(self.status(state, stopping_reason))
