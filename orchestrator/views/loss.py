"""The training loss of a run: its curve against steps, examples and wall time, the loss it ended at,
and when it first reached a target. Pure, from the heartbeats' progress records.

Each progress record carries the loss as cumulative sums (``protocol.LossTotals``: Σ loss and the
steps it covers), so the mean loss over any span is a difference, whatever records were dropped. The
curve's points are the intervals between one task's heartbeats (the first worker with a loss; ≥ 1 s,
thinned to ``MAX_POINTS``), each the mean over every worker's steps in it: under Keras ``fit`` a worker
logs the loss of its own share of the batch, so the job's loss is the workers' mean. A restarted
attempt counts on from the previous one (its counters start at 0 again).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .lossmodel import LossCurve

MAX_POINTS = 500
FINAL_SHARE = 0.1  # the final loss: the mean over the last 10 % of the steps (at least one interval)


@dataclass(frozen=True)
class Cum:
    """A task's cumulative counters at ``ts``, over every attempt so far."""

    ts: float
    steps: float
    examples: float | None
    loss_sum: float
    loss_steps: float


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def series(records: Iterable[Mapping[str, Any]]) -> tuple[dict[str, list[Cum]], str | None]:
    """Per task its cumulative points (heartbeats whose training progress carries a loss), and the
    loss's source (``callback``, ``user``, ``stamps``)."""
    out: dict[str, list[Cum]] = {}
    last: dict[str, tuple[Any, Cum]] = {}  # per task: (attempt, its last point in it)
    base: dict[str, Cum] = {}  # per task: the offsets of its earlier attempts
    source = None
    for rec in records:
        prog, task = rec.get("progress"), rec.get("task")
        if rec.get("kind") == "profile" or not isinstance(prog, Mapping) or not isinstance(task, str):
            continue
        loss = prog.get("loss")
        if prog.get("phase", "train") != "train" or not isinstance(loss, Mapping):
            continue
        ts, steps, s, n = _num(prog.get("ts")) or _num(rec.get("ts")), _num(prog.get("steps")), None, None
        s, n = _num(loss.get("sum")), _num(loss.get("steps"))
        if ts is None or steps is None or s is None or not n:
            continue
        source = loss.get("source") if isinstance(loss.get("source"), str) else source
        attempt = rec.get("attempt")
        prev = last.get(task)
        off = base.get(task, Cum(0.0, 0.0, 0.0, 0.0, 0.0))
        if prev is not None and prev[0] != attempt:
            off = base[task] = Cum(0.0, prev[1].steps, prev[1].examples, prev[1].loss_sum, prev[1].loss_steps)
        ex = _num(prog.get("examples"))
        pt = Cum(
            ts,
            off.steps + steps,
            None if ex is None or off.examples is None else off.examples + ex,
            off.loss_sum + s,
            off.loss_steps + n,
        )
        pts = out.setdefault(task, [])
        if pts and (pt.loss_steps <= pts[-1].loss_steps or pt.ts <= pts[-1].ts):
            continue  # the same record again (every heartbeat carries the last one)
        pts.append(pt)
        last[task] = (attempt, pt)
    return out, source


def _at(pts: Sequence[Cum], ts: float) -> Cum | None:
    """The cumulative counters at ``ts``, interpolated (None outside the task's points)."""
    if not pts or ts < pts[0].ts or ts > pts[-1].ts:
        return None
    i = bisect.bisect_left([p.ts for p in pts], ts)
    b = pts[i]
    if b.ts == ts or i == 0:
        return b
    a = pts[i - 1]
    f = (ts - a.ts) / (b.ts - a.ts)
    ex = None if a.examples is None or b.examples is None else a.examples + f * (b.examples - a.examples)
    return Cum(
        ts,
        a.steps + f * (b.steps - a.steps),
        ex,
        a.loss_sum + f * (b.loss_sum - a.loss_sum),
        a.loss_steps + f * (b.loss_steps - a.loss_steps),
    )


def _mean(tasks: Mapping[str, Sequence[Cum]], lo: float, hi: float) -> float | None:
    """The mean loss per step over [lo, hi] across every task with steps in it."""
    s = n = 0.0
    for pts in tasks.values():
        a, b = _at(pts, lo), _at(pts, hi)
        if a is not None and b is not None and b.loss_steps > a.loss_steps:
            s += b.loss_sum - a.loss_sum
            n += b.loss_steps - a.loss_steps
    return s / n if n > 0 else None


def loss_curve(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``report``'s ``loss``: the curve (step, examples, seconds since the first training step, loss), the
    final loss (the mean over the last ``FINAL_SHARE`` of the steps) and the last interval's; None
    when no worker reported a loss."""
    tasks, source = series(records)
    tasks = {t: p for t, p in tasks.items() if len(p) >= 2}
    if not tasks:
        return None
    ref = tasks[min(tasks)]
    t0 = ref[0].ts
    marks = (
        ref
        if len(ref) <= MAX_POINTS + 1
        else [ref[round(i * (len(ref) - 1) / MAX_POINTS)] for i in range(MAX_POINTS + 1)]
    )
    points = []
    for a, b in itertools.pairwise(marks):
        mean = _mean(tasks, a.ts, b.ts)
        if mean is not None:
            ex = None if b.examples is None else round(b.examples)
            points.append({"step": round(b.steps), "examples": ex, "time_s": round(b.ts - t0, 3), "loss": mean})
    end = ref[-1]
    cut = end.loss_steps - max(FINAL_SHARE * (end.loss_steps - ref[0].loss_steps), end.loss_steps - ref[-2].loss_steps)
    start = next((p for p in reversed(ref) if p.loss_steps <= cut), ref[0])
    first = marks[0]
    return {
        "source": source,
        "workers": len(tasks),
        "start": {
            "step": round(first.steps),
            "examples": None if first.examples is None else round(first.examples),
            "time_s": 0.0,
        },
        "points": points,
        "final": _mean(tasks, start.ts, end.ts),
        "last": points[-1]["loss"] if points else None,
        "steps": round(end.steps),
    }


def reached(curve: Mapping[str, Any] | None, target: float) -> dict[str, Any] | None:
    """When the curve first reaches ``target`` (steps, examples, seconds), or None. Each point is the mean
    loss over its interval, so it stands at the interval's middle; the crossing is interpolated between
    the last middle above the target and the first at or below it (an interval of a fast job can hold
    hundreds of steps: its end would overstate the steps by up to one interval)."""
    pts = (curve or {}).get("points") or []
    prev: dict[str, Any] = (curve or {}).get("start") or {"step": 0, "examples": 0, "time_s": 0.0}
    above: tuple[dict[str, float | None], float] | None = None
    for p in pts:
        mid = {
            k: None if p[k] is None or prev[k] is None else (p[k] + prev[k]) / 2 for k in ("step", "examples", "time_s")
        }
        if p["loss"] <= target:
            if above is None or above[1] == p["loss"]:
                at = mid
            else:
                f = (above[1] - target) / (above[1] - p["loss"])
                at = {
                    k: None if v is None or above[0][k] is None else above[0][k] + f * (v - above[0][k])
                    for k, v in mid.items()
                }
            return {
                "steps": None if at["step"] is None else round(at["step"]),
                "examples": None if at["examples"] is None else round(at["examples"]),
                "time_s": None if at["time_s"] is None else round(at["time_s"], 3),
                "loss": p["loss"],
            }
        above, prev = (mid, p["loss"]), p
    return None


def curve_report(records: Iterable[Mapping[str, Any]]) -> LossCurve | None:
    """``loss_curve`` as the report holds it (typed); None when no worker reported a loss."""
    curve = loss_curve(records)
    return None if curve is None else LossCurve.of(curve)


def loss_lines(curve: LossCurve | None, rows: int = 8) -> list[str]:
    """``report``'s text: a few points of the curve, the final loss."""
    if not curve:
        return []
    pts = curve.points
    pick = pts if len(pts) <= rows else tuple(pts[round(i * (len(pts) - 1) / (rows - 1))] for i in range(rows))
    out = [
        f"training loss ({_source(curve.source)}; the mean over {curve.workers} worker(s)' steps in each "
        f"interval): final {_g(curve.final)} (the last {FINAL_SHARE:.0%} of the steps)"
    ]
    out.append("  " + "  ".join(f"{h:>10}" for h in ("STEP", "EXAMPLES", "SECONDS", "LOSS")))
    for p in pick:
        ex = "-" if p.examples is None else f"{p.examples:,}"
        out.append("  " + "  ".join(f"{v:>10}" for v in (p.step, ex, f"{p.time_s:.1f}", _g(p.loss))))
    return out


def _source(source: Any) -> str:
    return {
        "callback": "Keras fit's batch logs",
        "user": "report_loss",
        "stamps": "the value the step function returns through strategy.reduce",
    }.get(str(source), str(source))


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"
