"""When a failed attempt's host was lost: the one definition both the live metrics (``sinks.metrics``)
and the recorded run's goodput (``views.recovery``) start "the loss to training again" from. Pure.

The loss is the culprit's last sign of life when a verdict on it says how long it had been silent or
stopped (``worker_lost``'s ``silent_s``, ``worker_hung``'s ``stopped_s``): the heartbeat timeout is part
of what a lost host costs. Otherwise it is the failure decision (the root cause's ``ts``): an exit, a
signal, a GPU fault or an unreachable host are seen when they happen.
"""

from __future__ import annotations

from collections.abc import Iterable

from .base import BaseEvent
from .verdicts import WorkerHung, WorkerLost

#: a verdict may be written a moment after the failure record that it caused
LATE_S = 1.0


def gone_for(event: BaseEvent) -> float | None:
    """How long a verdict's task had been silent or stopped when it was judged; None for other events."""
    if isinstance(event, WorkerLost):
        return event.silent_s
    if isinstance(event, WorkerHung):
        return event.stopped_s
    return None


def loss_ts(events: Iterable[BaseEvent], task: str | None, failed_at: float, since: float) -> float:
    """When the culprit ``task`` was last alive: the earliest among the verdicts on it in (``since``,
    ``failed_at`` + LATE_S] that say how long it had been gone, taken back by that long; else
    ``failed_at`` (never later than it)."""
    best = failed_at
    for e in events:
        if task is None or e.task != task or not since <= e.ts <= failed_at + LATE_S:
            continue
        gone = gone_for(e)
        if gone is not None and gone >= 0:
            best = min(best, e.ts - gone)
    return best
