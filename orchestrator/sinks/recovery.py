"""The cost of each failure while the job runs, for the Prometheus metrics: the loss to training again
and the work redone since the last backup (issue 34, item 8). Pure: fed events and status snapshots
(with their time), it keeps a few numbers; ``sinks.metrics`` exports them.

The same definitions as the recorded run's (``views.recovery``, what ``report``, goodput and TensorBoard
show), read from what the launcher sees live instead of from heartbeats.jsonl:

- the loss: ``events.recovery.loss_ts`` (the culprit's last sign of life, else the failure decision);
- training again: the next attempt's first status snapshot with a step, dated back by the steps it
  counts times their step time (never before the attempt started);
- work redone: the failed attempt's steps (the most any task counted) less those it had made by the
  end of the last epoch before the one the next attempt resumed at (Keras' BackupAndRestore saves at
  every epoch end); no epoch to go by: all of them. Seconds likewise, from the last snapshot of that
  epoch (or the attempt's first step) to the failure.

Snapshots come once a second: the live figures are that coarse; the report's are the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..events import BaseEvent
from ..events.kinds import AttemptFinished, AttemptStarted, Reshaped, WorkerHung, WorkerLost
from ..events.recovery import loss_ts


@dataclass
class _Attempt:
    """One attempt's progress as the snapshots showed it."""

    n: int
    start: float
    first: float | None = None  # its first step (dated back)
    steps: float = 0.0  # the most any task counted
    epochs: dict[int, tuple[float, float]] = field(default_factory=dict)  # epoch -> (steps, last seen)


@dataclass
class _Failure:
    attempt: _Attempt
    failed_at: float
    loss: float
    cause: str = "restart"


@dataclass
class Recoveries:
    """The failures recovered from so far: counts by cause, the last one's loss to training again, sums."""

    count: dict[str, int] = field(default_factory=dict)  # cause (host_lost, restart) -> failures
    last_loss_to_training_s: float | None = None
    loss_to_training_s: float = 0.0
    work_redone_steps: float = 0.0
    work_redone_s: float = 0.0


class RecoveryWatch:
    """Events and status snapshots in; ``done`` out (read under the metrics' lock)."""

    def __init__(self) -> None:
        self.done = Recoveries()
        self.attempt: _Attempt | None = None
        self.pending: _Failure | None = None
        self._verdicts: list[BaseEvent] = []  # this attempt's lost/hung verdicts: the loss's evidence

    def handle(self, event: BaseEvent) -> None:
        if isinstance(event, AttemptStarted):
            self.attempt, self._verdicts = _Attempt(event.attempt, event.ts), []
        elif isinstance(event, WorkerLost | WorkerHung):
            self._verdicts.append(event)
        elif isinstance(event, AttemptFinished) and self.attempt is not None:
            rc = event.root_cause
            ts = rc.get("ts") if rc is not None else None
            if event.state == "succeeded" or not isinstance(ts, int | float) or isinstance(ts, bool):
                self.pending = None
            else:
                task = rc.get("task") if rc is not None else None
                culprit = task if isinstance(task, str) else None
                lost = loss_ts(self._verdicts, culprit, float(ts), self.attempt.start)
                self.pending = _Failure(self.attempt, float(ts), lost)
        elif isinstance(event, Reshaped) and self.pending is not None:
            self.pending.cause = "host_lost"

    def update(self, status: Mapping[str, Any]) -> None:
        """A snapshot (``updated``: its time): the attempt's progress, and training again after a failure."""
        now, a = status.get("updated"), self.attempt
        tasks = status.get("tasks")
        if a is None or not _number(now) or not isinstance(tasks, Mapping) or status.get("attempt") != a.n:
            return
        first, epoch = None, None
        for t in tasks.values():
            steps = t.get("steps") if isinstance(t, Mapping) else None
            if not _number(steps) or steps <= 0:
                continue
            step_s = t.get("step_time_s")
            began = now - steps * step_s if _number(step_s) and step_s > 0 else now
            first = began if first is None else min(first, began)
            a.steps = max(a.steps, float(steps))
            ep = t.get("epoch")
            if _number(ep):
                epoch = int(ep) if epoch is None else min(epoch, int(ep))
                mark = a.epochs.get(int(ep), (0.0, now))
                a.epochs[int(ep)] = (max(mark[0], float(steps)), now)
        if first is None:
            return
        if a.first is None:
            a.first = max(a.start, first)
            if self.pending is not None and self.pending.attempt.n < a.n:
                self._recovered(self.pending, a.first, epoch)
                self.pending = None

    def _recovered(self, f: _Failure, again: float, resumed: int | None) -> None:
        d = self.done
        d.count[f.cause] = d.count.get(f.cause, 0) + 1
        d.last_loss_to_training_s = max(0.0, again - f.loss)
        d.loss_to_training_s += d.last_loss_to_training_s
        kept = [m for e, m in f.attempt.epochs.items() if resumed is not None and e < resumed]
        steps, since = max(kept) if kept else (0.0, f.attempt.first)
        d.work_redone_steps += max(0.0, f.attempt.steps - steps)
        if since is not None:
            d.work_redone_s += max(0.0, f.failed_at - since)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x and abs(x) != float("inf")
