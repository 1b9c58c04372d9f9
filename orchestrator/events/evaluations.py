"""The evaluator's evaluations, folded from ``evaluation`` events: one owner for status and report.

The supervisor adds each event it emits, over the whole run (status.json's ``evaluation`` entry of a
task: how many, the last one's metrics, checkpoint and step; the metrics sink reads that entry, while
TensorBoard takes the events themselves); ``report`` folds the same events read back from events.jsonl
and lists every one, per checkpoint."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import BaseEvent
from .kinds import Evaluation


def evaluation_record(e: Evaluation) -> dict[str, Any]:
    """One evaluation as status and report show it."""
    return {
        "ts": round(e.ts, 3),
        "checkpoint": e.checkpoint,
        "step": e.step,
        "metrics": dict(e.metrics),
        "source": e.source,
        **({"dropped": e.dropped} if e.dropped else {}),
    }


class Evaluations:
    """Per task: how many evaluations, the last one; with ``keep`` every one, in order (a report's)."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.count: dict[str, int] = {}
        self.lasts: dict[str, dict[str, Any]] = {}
        self.every: dict[str, list[dict[str, Any]]] = {}

    @classmethod
    def of(cls, events: Iterable[BaseEvent]) -> Evaluations:
        """Every evaluation among ``events`` (as read back from events.jsonl)."""
        folded = cls(keep=True)
        for e in events:
            if isinstance(e, Evaluation):
                folded.add(e)
        return folded

    def add(self, e: Evaluation) -> None:
        task = e.task or "?"
        self.count[task] = self.count.get(task, 0) + 1
        rec = self.lasts[task] = evaluation_record(e)
        if self.keep:
            self.every.setdefault(task, []).append(rec)

    def last(self, task: str) -> dict[str, Any] | None:
        """A task's status entry: how many evaluations it made and its last one; None before any."""
        if task not in self.lasts:
            return None
        return {"evaluations": self.count[task], **self.lasts[task]}
