"""A thousand workers in a report: the distribution of their figures and the outliers, not a row each.

``report`` lists every worker up to ``FULL_UP_TO``; past that, the percentiles of the step time and
of the work outside the all-reduce, then the rows of the workers at both ends (and every straggler):
the ones a person looks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..supervise.summary import FULL_UP_TO, TOP

PERCENTILES = (0, 10, 50, 90, 99, 100)


def _key(w: Mapping[str, Any]) -> float | None:
    v = w.get("pre_collective_ms") if w.get("pre_collective_ms") is not None else w.get("step_ms")
    if v is None and w.get("step_time_s") is not None:
        v = w["step_time_s"] * 1000.0
    return float(v) if isinstance(v, (int, float)) else None


def percentiles(values: list[float]) -> list[tuple[int, float]]:
    vals = sorted(values)
    return [(p, vals[min(len(vals) - 1, round(p / 100 * (len(vals) - 1)))]) for p in PERCENTILES] if vals else []


def shown(workers: Mapping[str, Mapping[str, Any]], stragglers: set[str]) -> tuple[list[str], list[str]]:
    """(the workers to list, lines about all of them): every one for a small job; else the slowest and
    fastest ``TOP`` by own work per step (step time without the step clock) and the stragglers."""
    if len(workers) <= FULL_UP_TO:
        return list(workers), []
    ranked = sorted((k, t) for t, w in workers.items() if (k := _key(w)) is not None)
    pick = {t for _, t in ranked[-TOP:]} | {t for _, t in ranked[:TOP]} | (stragglers & set(workers))
    lines = [
        f"{len(workers)} workers; below, the {TOP} slowest and {TOP} fastest by own work per step "
        "(step time without the step clock) and every straggler"
    ]
    for label, key in (("step ms", "step_ms"), ("own work ms", "pre_collective_ms"), ("steps/s", "steps_per_s")):
        vals = [float(w[key]) for w in workers.values() if isinstance(w.get(key), (int, float))]
        if vals:
            lines.append(f"  {label:12} " + "  ".join(f"p{p} {v:.1f}" for p, v in percentiles(vals)))
    return [t for t in workers if t in pick], lines
