"""The honest time split of a step, per worker and for the job, from step-clock windows. Pure.

Each ``profile`` record splits its mean step into parts that add up to it: ``input`` (waiting for the
batch), ``compute`` (forward + backward), ``collective`` (inside collectives), ``update`` (after the
gradient all-reduce: the optimizer update), ``host`` (between steps: framework, the loop's Python,
callbacks), ``other``. Step-weighted means over a worker's windows keep that sum exact.

A worker's time inside collectives is the all-reduce itself plus waiting for the slowest worker; the
worker that waits least there (the last to arrive) spends only the all-reduce itself in it, so
``all-reduce = min over workers of collective`` and ``waiting_w = collective_w - all-reduce``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..supervise.figures import PARTS, Split

__all__ = ["PARTS", "JobSplit", "job_split", "scores", "split_lines", "split_workers", "weighted"]


@dataclass(frozen=True)
class JobSplit:
    """The median worker's step in parts that add up to it (``report --json`` ``split``; ms), with its
    wait for the slowest worker separated from the all-reduce itself."""

    worker: str
    step_ms: float
    input_ms: float
    compute_ms: float
    waiting_for_slowest_ms: float
    allreduce_ms: float
    update_ms: float
    host_ms: float
    other_ms: float
    slowest_worker: str
    after_allreduce_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> JobSplit | None:
        """The split a sweep's scale.json keeps (``to_dict``'s shape) read back, for ``predict`` and
        ``scale`` to read by attribute like the report; None without a step time (the step clock was
        off), or when a field is not a number (a hand-edited file)."""
        if not isinstance(data, Mapping) or not data.get("step_ms"):
            return None
        names = {"worker", "slowest_worker"}
        try:
            return cls(
                **{
                    f: str(data.get(f) or "") if f in names else float(data.get(f) or 0.0)
                    for f in cls.__dataclass_fields__
                }
            )
        except (TypeError, ValueError):
            return None


def weighted(records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Step-weighted means of the split over a worker's windows (``figures.Split``, the one owner of
    a task's split: the supervisor and ``report`` add windows to it the same way)."""
    acc = Split()
    for r in records:
        acc.add(r)
    return acc.means()


def split_workers(workers: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Mapping[str, Any]], float]:
    """The workers with a split (a step and a time inside collectives), and the all-reduce itself:
    the least time any of them spends inside collectives (the last to arrive waits for nobody)."""
    have = {t: w for t, w in workers.items() if w.get("step_ms") and w.get("collective_ms") is not None}
    return have, min((w["collective_ms"] for w in have.values()), default=0.0)


def job_split(workers: Mapping[str, Mapping[str, Any]]) -> JobSplit | None:
    """The split of the median worker's step (by its own work per step), with the time it waits for
    the slowest worker separated from the all-reduce itself. The parts add up to its step."""
    have, allreduce = split_workers(workers)
    if not have:
        return None
    by_local = sorted(have, key=lambda t: have[t]["pre_collective_ms"])
    ref = by_local[(len(by_local) - 1) // 2]  # the median worker: a worker (its split adds up), not a mean of two
    w = have[ref]
    return JobSplit(
        worker=ref,
        step_ms=w["step_ms"],
        input_ms=w["input_ms"],
        compute_ms=w["compute_ms"],
        waiting_for_slowest_ms=round(w["collective_ms"] - allreduce, 3),
        allreduce_ms=round(allreduce, 3),
        update_ms=w["update_ms"],
        host_ms=w["host_ms"],
        other_ms=w["other_ms"],
        slowest_worker=by_local[-1],
        after_allreduce_ms=round(w["update_ms"] + w["host_ms"], 3),
    )


def split_lines(split: JobSplit, over: str) -> list[str]:
    s = split.step_ms
    parts = [
        ("input pipeline (waiting for the batch)", split.input_ms),
        ("compute before the all-reduce", split.compute_ms),
        (f"waiting for the slowest worker ({split.slowest_worker})", split.waiting_for_slowest_ms),
        ("the all-reduce itself", split.allreduce_ms),
        ("after it: optimizer update", split.update_ms),
        ("after it: framework, training loop, callbacks", split.host_ms),
    ]
    if split.other_ms:
        parts.append(("unattributed (no replica-function stamps)", split.other_ms))
    lines = [f"a step takes {s:.1f} ms ({split.worker}, the median worker; {over}):"]
    # (shares only of a step that took time: a summary.json planted with step_ms 0 crashed report)
    lines += [f"  {label:<52}{ms:8.1f} ms  " + (f"{ms / s:6.1%}" if s > 0 else "") for label, ms in parts]
    return lines


def scores(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per worker: relative = fastest worker's work per step / its own (last windows), individual =
    its best window / its last windows (medians of 3 windows)."""
    import statistics

    local: dict[str, list[float]] = {
        t: [float(r["pre_collective_ms"]) for r in rs if r.get("pre_collective_ms") is not None]
        for t, rs in records.items()
    }
    now = {t: statistics.median(v[-3:]) for t, v in local.items() if v}
    best = {t: min(statistics.median(v[i : i + 3]) for i in range(max(1, len(v) - 2))) for t, v in local.items() if v}
    if not now:
        return {}
    fastest = min(now.values())
    return {
        t: {
            "relative": round(fastest / now[t], 3) if now[t] > 0 else 1.0,
            "individual": round(best[t] / now[t], 3) if now[t] > 0 else 1.0,
        }
        for t in now
    }
