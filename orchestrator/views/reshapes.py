"""A run's reshapes (issue 34), as ``report`` and ``status`` show them: which host left and why, what
came in, the workers before and after, and the time from the host's loss to training again.

Who left and what came in: the ``reshaped`` events (events.jsonl). The loss to training again and the
work redone are goodput's figures (``views.recovery``: the culprit's last sign of life → the reshaped
attempt's first step), looked up by the failed attempt, never computed a second time here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..events import BaseEvent
from ..events.kinds import Reshaped
from .goodputmodel import Goodput


def reshape_report(events: Sequence[BaseEvent], goodput: Goodput | None = None) -> dict[str, Any]:
    """``{"reshapes": [...]}`` in the order they happened; {} for a run without any. ``goodput``: the
    run's (``views.goodput``), whose per-attempt figures give each reshape's cost."""
    failed = {a.attempt: a for a in (goodput.attempts if goodput is not None else ()) if a.cause}
    ordered = sorted(failed)
    out = []
    for e in events:
        if not isinstance(e, Reshaped):
            continue
        # the failed attempt before the reshaped one (attempt numbers can skip: a requeue keeps counting)
        before = max((n for n in ordered if isinstance(n, int) and n < e.attempt), default=None)
        cost = failed.get(before) if before is not None else None
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
                "loss_to_training_s": cost.loss_to_training_s if cost is not None else None,
                "work_redone_s": cost.lost_work_s if cost is not None else None,
                "work_redone_steps": cost.work_redone_steps if cost is not None else None,
            }
        )
    return {"reshapes": out} if out else {}


def reshape_lines(reshapes: Sequence[dict[str, Any]] | None) -> list[str]:
    """The report's lines: one per reshape."""
    if not reshapes:
        return []
    lines = ["", "hosts lost for good (reshapes):"]
    for r in reshapes:
        fewer = r["workers_before"] - r["workers_after"]
        came = f"spare {r['spare_in']} in" if r.get("spare_in") else f"no spare: {fewer} worker(s) fewer"
        again = r.get("loss_to_training_s")
        lines.append(
            f"  attempt {r['attempt']}: {r.get('host')} ({r.get('task')}) out — {r.get('reason')}; {came}; "
            f"{r['workers_before']} -> {r['workers_after']} workers; loss to training again "
            + (f"{again:.1f} s" if again is not None else "unknown (it never trained again)")
            + (f"; work redone {r['work_redone_s']:.1f} s" if r.get("work_redone_s") is not None else "")
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
