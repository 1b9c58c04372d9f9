"""Statistical efficiency beside throughput: will N workers reach the loss N times sooner? Pure.

Throughput says how many examples per second more workers process; whether those examples buy the same
progress per example is statistical efficiency. ``scale`` **measures** it — every size for the same
examples (the loss each reached) or to the same loss (the steps, examples and time each took) — and
``predict`` **bounds** it from the gradient noise scale measured at one size (``noise_scale``): steps to
the same loss at a global batch M are at least (1 + B/M)/(1 + B/M₀) times those at M₀, so time to that
loss is at least that times the predicted step time. Both assume the learning rate is re-tuned for each
batch (the linear scaling rule with warmup, Goyal et al. 2017, up to the critical batch); a script that
keeps its learning rate gets fewer gains than the bound, and stability may forbid the larger rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.text import table
from ..runs import RunDir
from .loss import loss_curve, reached
from .lossmodel import NoiseScale
from .noise_scale import best_workers, critical_workers, efficiency, noise_report, steps_ratio
from .records import heartbeat_records

#: Doubling sizes tried for the worker count past which time to loss stops falling.
MAX_WORKERS = 1024


def run_noise(run_dir: str | Path, records: Sequence[Mapping[str, Any]] | None = None) -> NoiseScale:
    """The noise scale of a run directory (its step-clock windows)."""
    recs = records if records is not None else heartbeat_records(RunDir(Path(run_dir)).heartbeats_jsonl)
    windows: dict[str, list[Mapping[str, Any]]] = {}
    for r in recs:
        if r.get("kind") == "profile" and isinstance(r.get("task"), str):
            windows.setdefault(r["task"], []).append(r)
    return noise_report(windows)


def noise_of(measured: Sequence[Mapping[str, Any]]) -> tuple[NoiseScale, int]:
    """The noise scale of the smallest measured size that resolved it (one worker cannot: one replica),
    and that size; else the smallest size's (with its reason)."""
    first: tuple[NoiseScale, int] | None = None
    for m in measured:
        ns = run_noise(m["run_dir"])
        if ns.b_simple is not None:
            return ns, int(m["workers"])
        first = first or (ns, int(m["workers"]))
    return first or (NOTHING_MEASURED, 1)


#: ``noise_of`` with no measured size (``predict --json`` prints only its reason).
NOTHING_MEASURED = NoiseScale(reason="nothing measured")


def noise_json(ns: NoiseScale) -> dict[str, Any]:
    """``predict --json`` ``noise_scale``: the report's figures without the windows."""
    if ns is NOTHING_MEASURED:
        return {"reason": ns.reason}
    return {k: v for k, v in ns.to_dict().items() if k != "windows"}


def measure_loss(records: Sequence[Mapping[str, Any]], run_dir: str, target: float | None) -> dict[str, Any]:
    """One size's loss figures for scale.json: its curve, the loss it ended at, when it reached ``target``,
    and its own noise scale."""
    curve = loss_curve(records)
    hit = reached(curve, target) if target is not None else None
    ns = run_noise(run_dir, records)
    return {
        "loss": curve,
        "final_loss": (curve or {}).get("final"),
        "steps_to_loss": hit["steps"] if hit else None,
        "time_to_loss_s": hit["time_s"] if hit else None,
        "examples_to_loss": hit["examples"] if hit else None,
        "b_simple": ns.b_simple,
        "b_simple_stderr": ns.stderr,
        "b_simple_reason": ns.reason,
    }


def compare_loss(sizes: list[dict[str, Any]], target: float | None) -> list[str]:
    """Each size's measured statistical efficiency against the smallest that reached the target (examples
    to the loss there / here), and the bound the smallest size's B_simple gives; notes."""
    notes: list[str] = []
    base = next((s for s in sizes if s.get("examples_to_loss")), None)
    known = next((s for s in sizes if s.get("b_simple") and s.get("global_batch")), None)
    for s in sizes:
        s["stat_efficiency"] = None
        s["steps_to_loss_bound"] = None
        if base is not None and s.get("examples_to_loss"):
            s["stat_efficiency"] = round(base["examples_to_loss"] / s["examples_to_loss"], 3)
        if base is not None and known is not None and s.get("global_batch") and base.get("global_batch"):
            ratio = steps_ratio(known["b_simple"], base["global_batch"], s["global_batch"])
            s["steps_to_loss_bound"] = math.ceil(ratio * base["steps_to_loss"])
    if target is not None and base is None:
        notes.append(f"no size reached the training loss {target:g} within its bound: train longer (--examples)")
    elif target is not None:
        missed = [str(s["workers"]) for s in sizes if s.get("steps_per_s") and not s.get("steps_to_loss")]
        if missed:
            notes.append(f"loss {target:g} not reached within the bound at {', '.join(missed)} worker(s)")
    if known is not None:
        notes.append(
            f"bound: B_simple {known['b_simple']:.0f} measured at {known['workers']} worker(s) — steps to the loss at "
            "least (1 + B/M)/(1 + B/M0) those of the smallest size (an upper bound on what more workers save)"
        )
    return notes


def loss_table(summary: Mapping[str, Any]) -> list[str]:
    """The sweep's statistical efficiency, beside its throughput table."""
    sizes = [s for s in summary.get("sizes") or [] if s.get("loss") or s.get("b_simple")]
    if not sizes:
        return []
    target = summary.get("target_loss")
    head = ["WORKERS", "GLOBAL BATCH", "FINAL LOSS"]
    head += (
        [f"STEPS TO {target:g}", "BOUND: STEPS >=", "TIME TO LOSS", "EXAMPLES TO LOSS", "STAT EFF"] if target else []
    )
    rows = [(*head, "B_SIMPLE")]
    for s in sizes:
        row = [str(s["workers"]), _f(s.get("global_batch"), ".0f"), _f(s.get("final_loss"), ".4g")]
        if target:
            row += [
                _f(s.get("steps_to_loss"), "d"),
                _f(s.get("steps_to_loss_bound"), "d"),
                _f(s.get("time_to_loss_s"), ".1f", " s"),
                _f(s.get("examples_to_loss"), ",d"),
                _f(None if s.get("stat_efficiency") is None else 100 * s["stat_efficiency"], ".0f", "%"),
            ]
        b, se = s.get("b_simple"), s.get("b_simple_stderr")
        row.append("-" if b is None else f"{b:.0f}" + ("" if se is None else f" ± {se:.0f}"))
        rows.append(tuple(row))
    what = "same examples per size" if summary.get("examples") else "each size's bound"
    return [
        f"training loss and statistical efficiency ({what}; the loss: mean over the last 10% of the steps):",
        *table(rows),
    ]


# ------------------------------------------------------------------------------------ predict


def bound_sizes(rows: list[dict[str, Any]], ns: NoiseScale, base_workers: int, per_worker: float | None) -> None:
    """``predict``'s rows gain, from B_simple at the measured size: statistical efficiency, and the steps
    and time to the same loss relative to the measured size — lower bounds."""
    b = ns.b_simple
    base = next((r for r in rows if r["workers"] == base_workers), None)
    if b is None or not per_worker or base is None or not base.get("step_ms"):
        return
    m0 = base_workers * per_worker
    for r in rows:
        m = r["workers"] * per_worker
        steps = steps_ratio(b, m0, m)
        r["statistical_efficiency"] = round(efficiency(b, m0, m), 3)
        r["steps_to_loss_at_least"] = round(steps, 3)
        r["time_to_loss_at_least"] = round(steps * r["step_ms"] / base["step_ms"], 3) if r.get("step_ms") else None


def time_to_loss_curve(
    ns: NoiseScale, predict_at: Any, base_workers: int, per_worker: float
) -> list[tuple[int, float]]:
    """(workers, time to the loss relative to the measured size) at 1, 2, 4, ... ``MAX_WORKERS``."""
    b, m0 = ns.b_simple, base_workers * per_worker
    if b is None:
        return []
    base_ms = predict_at(base_workers)["step_ms"]
    out, n = [], 1
    while n <= MAX_WORKERS:
        out.append((n, steps_ratio(b, m0, n * per_worker) * predict_at(n)["step_ms"] / base_ms))
        n *= 2
    return out


def time_to_loss_summary(
    ns: NoiseScale, per_worker: float | None, curve: list[tuple[int, float]]
) -> dict[str, Any] | None:
    """``predict --json``: the critical batch in workers, the worker count with the shortest predicted time
    to the loss (``still_falling``: the largest tried), and the curve (workers, time relative)."""
    if ns.b_simple is None or not per_worker or not curve:
        return None
    best, still = best_workers(curve)
    return {
        "critical_batch": ns.b_simple,
        "critical_workers": round(critical_workers(ns.b_simple, per_worker), 2),
        "best_workers": best,
        "still_falling": still,
        "relative_time": [{"workers": n, "time": round(t, 3)} for n, t in curve],
    }


def predict_lines(
    ns: NoiseScale, base_workers: int, per_worker: float | None, curve: list[tuple[int, float]]
) -> list[str]:
    """``predict``'s statistical efficiency: the bound's wording, the critical batch, the worker count
    past which time to loss stops falling, and what the learning rate would have to do."""
    b, se = ns.b_simple, ns.stderr
    if b is None:
        why = ns.reason or "not measured"
        return [f"statistical efficiency: not predicted — the gradient noise scale is not resolved ({why})"]
    err = f" ± {se:.0f}" if se is not None else ""
    at = f" at loss {ns.loss:.4g}" if ns.loss is not None else ""
    lines = [
        f"statistical efficiency from the gradient noise scale measured at {base_workers} worker(s): "
        f"B_simple ≈ {b:.0f}{err} examples{at}",
        "  STEPS TO LOSS and TIME TO LOSS are lower bounds relative to the measured size: at least that many steps "
        "(B_simple overestimates the noise that limits large batches), at best that time — never a promise",
    ]
    if per_worker:
        crit = critical_workers(b, per_worker)
        lines.append(
            f"  critical batch ≈ B_simple = {b:.0f}: ≈ {crit:.1f} workers of {per_worker:.0f} examples; past it each doubling "
            "of the workers saves less than a third of the steps"
        )
        best, still = best_workers(curve)
        lines.append(
            f"  time to the same loss (this throughput model x the bound) still falls at {best} workers"
            if still
            else f"  past {best} workers more workers stop shortening the time to the same loss (this throughput model "
            "x the bound)"
        )
    return lines


def lr_advice(ns: NoiseScale, base_workers: int, sizes: Sequence[int], per_worker: float | None) -> list[str]:
    """The learning rate the bound assumes: the linear scaling rule with warmup, up to the critical batch."""
    b = ns.b_simple
    if b is None or not per_worker:
        return []
    top = max(sizes)
    k = top / base_workers
    cap = max(1.0, b / (base_workers * per_worker))
    return [
        f"critical batch ≈ {b:.0f} examples (B_simple at loss {_f(ns.loss, '.4g')}; it grows as the loss falls): to get "
        f"the predicted steps at {top} workers the learning rate must grow with the global batch — the linear scaling "
        f"rule with a gradual warmup (Goyal et al. 2017) asks for {k:g}x the learning rate of {base_workers} worker(s), "
        f"and it stops paying past ≈ {cap:.1f}x (a global batch of ≈ B_simple); stability may forbid the larger rate (an "
        "ill-conditioned loss caps it): probe it before relying on these numbers"
    ]


def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else f"{format(v, fmt)}{suffix}"
