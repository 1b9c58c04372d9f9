"""A run's reshapes (issue 34), as ``report`` and ``status`` show them: which host left and why, what
came in, the workers before and after, and the time from the host's loss to training again.

"Training again" is when the last task of the reshaped attempt started (its ``task_started``: the
collective can run from then); "the loss" is when the host failed (the root cause's time, carried
by the ``reshaped`` event). Read from events.jsonl, the one record of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..events import BaseEvent
from ..events.kinds import AttemptFinished, AttemptStarted, Reshaped, TaskStarted


def reshape_report(events: Sequence[BaseEvent]) -> dict[str, Any]:
    """``{"reshapes": [...]}`` in the order they happened; {} for a run without any."""
    started: dict[int, float] = {}  # attempt -> the last task_started of it
    attempt: int | None = None
    for e in events:
        if isinstance(e, AttemptStarted):
            attempt = e.attempt
        elif isinstance(e, AttemptFinished):
            attempt = None
        elif isinstance(e, TaskStarted) and attempt is not None:
            started[attempt] = max(started.get(attempt, 0.0), e.ts)
    out = []
    for e in events:
        if not isinstance(e, Reshaped):
            continue
        again = started.get(e.attempt)
        out.append(
            {
                "attempt": e.attempt,
                "host": e.host,
                "task": e.task,
                "reason": e.reason,
                "spare_in": e.spare_in,
                "workers_before": e.workers_before,
                "workers_after": e.workers_after,
                "spares_left": e.spares_left,
                "lost_ts": e.lost_ts,
                "training_again_ts": again,
                "loss_to_training_s": round(again - e.lost_ts, 1) if again and e.lost_ts else None,
            }
        )
    return {"reshapes": out} if out else {}


def reshape_lines(reshapes: Sequence[dict[str, Any]] | None) -> list[str]:
    """The report's lines: one per reshape."""
    if not reshapes:
        return []
    lines = ["", "hosts lost for good (reshapes):"]
    for r in reshapes:
        came = f"spare {r['spare_in']} in" if r.get("spare_in") else "no spare: one worker fewer"
        again = r.get("loss_to_training_s")
        lines.append(
            f"  attempt {r['attempt']}: {r.get('host')} ({r.get('task')}) out — {r.get('reason')}; {came}; "
            f"{r['workers_before']} -> {r['workers_after']} workers; loss to training again "
            + (f"{again:.1f} s" if again is not None else "unknown (it never trained again)")
        )
    return lines


def elastic_lines(elastic: Any) -> list[str]:
    """``status``'s lines: the hosts excluded, with why, and the spares left (status.json ``elastic``)."""
    if not isinstance(elastic, dict):
        return []
    lines = []
    for e in elastic.get("excluded") or []:
        if isinstance(e, dict):
            lines.append(
                f"host excluded: {e.get('host')} ({e.get('task')}, attempt {e.get('attempt')}): {e.get('reason')}"
            )
    spares = [s for s in elastic.get("spares") or [] if isinstance(s, str)]
    if spares or lines:
        workers, planned = elastic.get("workers"), elastic.get("planned_workers")
        lines.append(f"spares left: {', '.join(spares) or 'none'}   workers: {workers} of {planned} planned")
    return lines
