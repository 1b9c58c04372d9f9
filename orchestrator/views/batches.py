"""The batch each size of a sweep really ran, and whether that is weak or strong scaling. Pure.

Weak scaling keeps the per-worker batch (the global batch grows with the workers), strong scaling keeps
the global batch. A sweep asks for one; the script decides. The batch is the *median step's*: the step
clock's ``batch_p50`` per window (protocol ``Profile``). The mean over a run (examples/s ÷ steps/s) is
pulled down by every epoch's partial last batch — measured (issue 32): the TF tutorial's 6,000 examples in
global batches of 192 at 3 workers read as 62 per worker instead of 64, and `scale` called its weak
scaling strong.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

#: Batches within this relative difference are "the same" (a rounding, not a different batch).
SAME = 0.02


def global_batch(
    records: Iterable[Mapping[str, Any]], examples_per_s: float | None, steps_per_s: float | None
) -> tuple[float | None, str | None]:
    """(the run's global batch, where it comes from): the median of its step-clock windows' median-step
    batch when they carry one, else the mean over the run's steps (a partial batch pulls it down)."""
    median = [float(r["batch_p50"]) for r in records if r.get("kind") == "profile" and r.get("batch_p50")]
    if median:
        return statistics.median(median), "median step"
    if examples_per_s and steps_per_s:
        return examples_per_s / steps_per_s, "mean step"
    return None, None


def _same(values: list[float]) -> bool:
    return max(values) <= min(values) * (1 + SAME)


def scaling_of(batches: Mapping[int, tuple[float, float]]) -> str | None:
    """ "weak" (the per-worker batch kept, the global one grew), "strong" (the global batch kept), or None
    (neither, or fewer than two sizes) from {workers: (global batch, per-worker batch)}."""
    if len(batches) < 2:
        return None
    globals_ = [g for g, _ in batches.values()]
    per_worker = [p for _, p in batches.values()]
    if _same(per_worker) and not _same(globals_):
        return "weak"
    if _same(globals_):
        return "strong"
    return None


def _listed(batches: Mapping[int, tuple[float, float]], i: int) -> str:
    return ", ".join(f"{v[i]:g} at {n}" for n, v in sorted(batches.items()))


def batch_notes(batches: Mapping[int, tuple[float, float]], strong: bool, source: str | None) -> list[str]:
    """What the sizes ran against what the sweep asked for (``strong``), each with the batches seen."""
    measured = scaling_of(batches)
    if len(batches) < 2:
        return []
    how = " (each size's median step: an epoch's partial last batch left out)" if source == "median step" else ""
    if measured == "weak" and strong:
        return [
            f"--strong asked for the same global batch at every size, but the script used {_listed(batches, 0)}"
            f"{how}: it keeps its per-worker batch, so this measured weak scaling; make it call "
            "worker_entry.sweep_batch_size(per_worker_batch) (or read TFCLUSTER_SCALE_*)"
        ]
    if measured == "strong" and not strong:
        return [
            f"weak scaling keeps the per-worker batch, but the script used {_listed(batches, 1)} per worker{how}: "
            "it keeps a fixed global batch, so this measured strong scaling"
        ]
    if measured == "weak":
        return [
            f"weak scaling: the script kept its per-worker batch ({_listed(batches, 1)}) and its global batch grew "
            f"with the workers ({_listed(batches, 0)}){how}"
        ]
    if measured == "strong":
        return [f"strong scaling: the script kept its global batch ({_listed(batches, 0)}){how}"]
    return [
        f"neither weak nor strong scaling: the script's per-worker batch changed ({_listed(batches, 1)}) and its "
        f"global batch too ({_listed(batches, 0)}){how}: speed-ups compare different work per step"
    ]
