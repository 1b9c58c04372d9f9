"""The cost of a failure, per failed attempt and totalled: the time from the loss to training again,
and the work redone since the last backup (issue 34, item 8). Pure; ``goodput`` is its one caller and
owner of the figures: ``report`` (text, HTML, ``--json``), the goodput breakdown and TensorBoard all
show what goodput computed, never a second reading.

Definitions (docs/architecture.md, "The cost of a lost host"):

- **the loss**: ``events.recovery.loss_ts`` (the live metrics start from it too): the failed attempt's
  culprit's last sign of life when a verdict says how long it was silent or stopped (``worker_lost``'s
  ``silent_s``, ``worker_hung``'s ``stopped_s``); otherwise the failure decision itself (the root
  cause's ``ts``: an exit, a signal, a GPU fault, an unreachable host are seen when they happen).
- **training again**: the next attempt's first training step (goodput's ``first``: its earliest
  progress record dated back by its step time, never before the attempt started).
- ``loss_to_training_s`` = training again - the loss: the silence before the verdict, the teardown,
  the restart or reshape, and the next attempt's own startup (connecting, TensorFlow, restoring).
  None when the next attempt never trained.
- ``work_redone_s``: the failed attempt's training after its last backup (goodput's lost work);
  ``work_redone_steps``: the steps its tasks reported in that time (the most any task reported: every
  worker of MWMS steps together; a floor, records are rate-limited).
- ``cause``: ``host_lost`` when the next attempt ran on a new plan (a ``reshaped`` event: the host was
  out for good), ``restart`` when it ran in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..events import BaseEvent, kinds
from ..events.recovery import loss_ts
from .goodputmodel import Goodput

__all__ = ["cause_of", "loss_ts", "recovery_lines", "steps_between", "totals"]


def steps_between(steps: Iterable[tuple[float, float, Any]], after: float | None, until: float) -> int | None:
    """Steps reported by records ``(ts, cumulative steps, task)`` of one attempt after ``after`` (None:
    from the attempt's start) up to ``until``: per task, its last count by ``until`` less its last count
    by ``after``; the most of any task. None without a record by ``until``."""
    last: dict[Any, float] = {}
    base: dict[Any, float] = {}
    for ts, n, task in sorted(steps, key=lambda r: r[0]):
        if ts > until:
            break
        last[task] = n
        if after is not None and ts <= after:
            base[task] = n
    if not last:
        return None
    return int(max(max(0.0, n - base.get(task, 0.0)) for task, n in last.items()))


def cause_of(events: Sequence[BaseEvent], next_attempt: int) -> str:
    """``host_lost`` when ``next_attempt`` ran on a new plan without a host, else ``restart``."""
    reshaped = any(isinstance(e, kinds.Reshaped) and e.attempt == next_attempt for e in events)
    return "host_lost" if reshaped else "restart"


def totals(details: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's sums over its failed attempts that were followed by another; None without any."""
    failed = [d for d in details if d.get("cause")]
    if not failed:
        return None
    again = [d["loss_to_training_s"] for d in failed if d.get("loss_to_training_s") is not None]
    steps = [d["work_redone_steps"] for d in failed if d.get("work_redone_steps") is not None]
    return {
        "failures": len(failed),
        "hosts_lost": sum(1 for d in failed if d["cause"] == "host_lost"),
        "loss_to_training_s": round(sum(again), 3) if again else None,
        "loss_to_training_max_s": round(max(again), 3) if again else None,
        "work_redone_s": round(sum(float(d.get("lost_work_s") or 0.0) for d in failed), 3),
        "work_redone_steps": sum(steps) if steps else None,
    }


def recovery_lines(g: Goodput) -> list[str]:
    """The report's lines: one per failure followed by another attempt, then the totals."""
    rec = g.recovery
    if not isinstance(rec, Mapping):
        return []
    lines = []
    for d in g.attempts:
        if not d.cause:
            continue
        what = "host lost for good" if d.cause == "host_lost" else "restart in place"
        again = d.loss_to_training_s
        steps = d.work_redone_steps
        lines.append(
            f"  attempt {d.attempt} ({what}): loss to training again "
            + (f"{again:.1f} s" if again is not None else "unknown (the next attempt never trained)")
            + f"; work redone {float(d.lost_work_s or 0.0):.1f} s"
            + (f" ({steps} steps reported)" if steps is not None else "")
        )
    again = rec.get("loss_to_training_s")
    steps = rec.get("work_redone_steps")
    lines.append(
        f"  recovery in all: {rec['failures']} failure(s), {rec['hosts_lost']} host(s) lost; loss to training "
        + (f"again {again:.1f} s" if again is not None else "again unknown")
        + f"; work redone {rec['work_redone_s']:.1f} s"
        + (f" ({steps} steps reported)" if steps is not None else "")
    )
    return lines
