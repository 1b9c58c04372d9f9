"""The evaluator's evaluations in `status`, `report` (text, JSON) and `report --html`.

Folded once (``events.evaluations``): status.json carries each evaluator's count and last evaluation
as the supervisor folded them live; the report folds the ``evaluation`` events of events.jsonl and
lists every one, per checkpoint, with the metrics as the evaluator reported them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.text import table
from ..events import BaseEvent
from ..events.evaluations import Evaluations

MAX_ROWS = 50  # evaluations a text report lists per task (the JSON report has every one)


def evaluation_report(events: Iterable[BaseEvent]) -> dict[str, Any]:
    """``{"evaluations": {task: [evaluation, ...]}}`` for the report, or {} when none was made."""
    every = Evaluations.of(events).every
    return {"evaluations": every} if every else {}


def _checkpoint(path: Any) -> str:
    return os.path.basename(str(path).rstrip("/")) or str(path) if path else "-"


def _metrics(metrics: Mapping[str, Any]) -> str:
    return " ".join(f"{k} {v:.6g}" for k, v in metrics.items() if isinstance(v, int | float))


def _names(rows: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for r in rows:
        names += [k for k in r.get("metrics") or {} if k not in names]
    return names


def evaluation_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """A table of evaluations: checkpoint, step and one column per metric."""
    names = _names(rows)
    body = [
        [
            _checkpoint(r.get("checkpoint")),
            "-" if r.get("step") is None else str(r["step"]),
            *(format(m[n], ".6g") if isinstance(m := r.get("metrics") or {}, dict) and n in m else "-" for n in names),
        ]
        for r in rows
    ]
    return ["CHECKPOINT", "STEP", *names], body


def evaluation_lines(evaluations: Any) -> list[str]:
    """The report's section: per evaluator task, every evaluation (the last ``MAX_ROWS``)."""
    if not isinstance(evaluations, dict) or not evaluations:
        return []
    lines: list[str] = []
    for task, rows in sorted(evaluations.items()):
        lines += ["", f"evaluations of {task} ({len(rows)}, as it reported them):"]
        if len(rows) > MAX_ROWS:
            lines.append(f"  (the last {MAX_ROWS}; report --json lists every one)")
        head, body = evaluation_rows(rows[-MAX_ROWS:])
        lines += ["  " + line for line in table([head, *body])]
    return lines


def status_lines(tasks: Mapping[str, Any]) -> list[str]:
    """`tfcluster status`: each evaluator's last evaluation and how many it made."""
    lines = []
    for name, t in sorted(tasks.items()):
        e = t.get("evaluation") if isinstance(t, dict) else None
        if not isinstance(e, dict):
            continue
        step = "" if e.get("step") is None else f" (step {e['step']})"
        lines.append(
            f"  {name}: {e.get('evaluations')} evaluation(s); last: checkpoint {_checkpoint(e.get('checkpoint'))}"
            f"{step}: {_metrics(e.get('metrics') or {})}"
        )
    return ["", "evaluations:", *lines] if lines else []


def evaluation_section(page: Any, evaluations: Any) -> None:
    """The HTML report's section: one table per evaluator task."""
    if not isinstance(evaluations, dict) or not evaluations:
        return
    for task, rows in sorted(evaluations.items()):
        page.h2(f"Evaluations of {task} ({len(rows)})")
        head, body = evaluation_rows(rows)
        page.table([h.lower() for h in head], body)
