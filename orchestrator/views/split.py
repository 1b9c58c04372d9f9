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
from typing import Any

PARTS = ("input_ms", "compute_ms", "collective_ms", "update_ms", "host_ms", "other_ms")


def weighted(records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Step-weighted means of the split over a worker's windows (records without a split — an older
    or profiler-sourced record — count with ``other`` = step - the parts they have)."""
    total = 0.0
    sums = dict.fromkeys(("step_ms", *PARTS), 0.0)
    for r in records:
        n, step = r.get("steps") or 0, r.get("step_ms")
        if not n or step is None or r.get("collective_ms") is None:
            continue
        parts = {k: float(r.get(k) or 0.0) for k in PARTS}
        known = sum(v for k, v in parts.items() if k != "other_ms")
        parts["other_ms"] = max(0.0, float(step) - known) if r.get("update_ms") is None else parts["other_ms"]
        total += n
        sums["step_ms"] += n * float(step)
        for k in PARTS:
            sums[k] += n * parts[k]
    if total <= 0:
        return None
    out = {k: round(v / total, 3) for k, v in sums.items()}
    out["pre_collective_ms"] = round(out["step_ms"] - out["collective_ms"], 3)
    return out


def split_workers(workers: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Mapping[str, Any]], float]:
    """The workers with a split (a step and a time inside collectives), and the all-reduce itself:
    the least time any of them spends inside collectives (the last to arrive waits for nobody)."""
    have = {t: w for t, w in workers.items() if w.get("step_ms") and w.get("collective_ms") is not None}
    return have, min((w["collective_ms"] for w in have.values()), default=0.0)


def job_split(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The split of the median worker's step (by its own work per step), with the time it waits for
    the slowest worker separated from the all-reduce itself. The parts add up to its step."""
    have, allreduce = split_workers(workers)
    if not have:
        return None
    by_local = sorted(have, key=lambda t: have[t]["pre_collective_ms"])
    ref = by_local[(len(by_local) - 1) // 2]
    w = have[ref]
    split = {
        "worker": ref,
        "step_ms": w["step_ms"],
        "input_ms": w["input_ms"],
        "compute_ms": w["compute_ms"],
        "waiting_for_slowest_ms": round(w["collective_ms"] - allreduce, 3),
        "allreduce_ms": round(allreduce, 3),
        "update_ms": w["update_ms"],
        "host_ms": w["host_ms"],
        "other_ms": w["other_ms"],
        "slowest_worker": by_local[-1],
    }
    split["after_allreduce_ms"] = round(split["update_ms"] + split["host_ms"], 3)
    return split


def split_lines(split: Mapping[str, Any], over: str) -> list[str]:
    s = split["step_ms"]
    parts = [
        ("input pipeline (waiting for the batch)", split["input_ms"]),
        ("compute before the all-reduce", split["compute_ms"]),
        (f"waiting for the slowest worker ({split['slowest_worker']})", split["waiting_for_slowest_ms"]),
        ("the all-reduce itself", split["allreduce_ms"]),
        ("after it: optimizer update", split["update_ms"]),
        ("after it: framework, training loop, callbacks", split["host_ms"]),
    ]
    if split["other_ms"]:
        parts.append(("unattributed (no replica-function stamps)", split["other_ms"]))
    lines = [f"a step takes {s:.1f} ms ({split['worker']}, the median worker; {over}):"]
    lines += [f"  {label:<52}{ms:8.1f} ms  {ms / s:6.1%}" for label, ms in parts]
    return lines


def scores(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per worker: relative = fastest worker's work per step / its own (last windows), individual =
    its best window / its last windows (medians of 3 windows)."""
    import statistics

    local: dict[str, list[float]] = {
        t: [float(r["pre_collective_ms"]) for r in rs if r.get("pre_collective_ms") is not None] for t, rs in records.items()
    }
    now = {t: statistics.median(v[-3:]) for t, v in local.items() if v}
    best = {
        t: min(statistics.median(v[i : i + 3]) for i in range(max(1, len(v) - 2))) for t, v in local.items() if v
    }
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
