"""The backup interval that maximises goodput: the Young-Daly optimum T = √(2 · C · M). Pure.

A backup every T seconds costs C each time (training waits while the chief saves); a failure, one every
M seconds on average (the MTBF), loses on average half an interval of work. To first order the
fraction of time lost is ``C / T + T / (2 M)``, least at T = √(2 C M) (Young 1974; Daly 2006 adds
higher-order terms that matter only when C is not small against M).

The inputs, each with where it came from:

- **C, the save cost**: from the ``backup_copied`` events — ``save_s``, the chief's writing of a save
  from its first to its last changed file (a floor: the first file's own write is not in it); where no
  save shows a span, the copy's own duration (``copy_s``) stands in for it. ``predict --save-cost``
  overrides it.
- **M, the MTBF**: the run's wall time over its failed attempts, or the user's (``predict --mtbf 6h``).
  A run without a failure gives no MTBF (only a lower bound: its own length).
- **the interval now**: the median gap between consecutive copies within an attempt (Keras'
  ``BackupAndRestore`` saves at every epoch end by default: then this is about an epoch).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from ..events import BaseEvent, kinds


def young_daly(save_s: float, mtbf_s: float) -> float:
    """The interval between backups that loses the least time: √(2 · save cost · MTBF)."""
    if save_s < 0 or mtbf_s <= 0:
        raise ValueError("the save cost must be >= 0 and the MTBF > 0")
    return math.sqrt(2.0 * save_s * mtbf_s)


def lost_fraction(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """The share of time a backup every ``interval_s`` loses, to first order: saving plus redone work."""
    if interval_s <= 0 or mtbf_s <= 0:
        raise ValueError("the interval and the MTBF must be > 0")
    return save_s / interval_s + interval_s / (2.0 * mtbf_s)


def save_cost(copies: Iterable[kinds.BackupCopied]) -> dict[str, Any] | None:
    """C from the copies: the median chief's save span, else the median copy time; None without copies."""
    copies = list(copies)
    if not copies:
        return None
    spans = [c.save_s for c in copies if c.save_s > 0]
    if spans:
        return {
            "value_s": statistics.median(spans),
            "source": "the chief's saves (first to last file)",
            "n": len(spans),
        }
    return {"value_s": statistics.median(c.copy_s for c in copies), "source": "the copies' duration", "n": len(copies)}


def run_mtbf(events: Iterable[BaseEvent], wall_s: float) -> dict[str, Any]:
    """M from the run: wall time / failed attempts (``value_s`` None without a failure)."""
    failures = sum(1 for e in events if isinstance(e, kinds.AttemptFinished) and e.state == "failed")
    value = wall_s / failures if failures and wall_s > 0 else None
    return {"value_s": value, "source": "this run", "failures": failures, "over_s": round(wall_s, 3)}


def interval_now(copies: Iterable[kinds.BackupCopied]) -> float | None:
    """The median gap between consecutive copies of one attempt (None with fewer than two)."""
    by_attempt: dict[int, list[float]] = {}
    for c in copies:
        by_attempt.setdefault(c.attempt, []).append(c.ts)
    gaps = [b - a for ts in by_attempt.values() for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else None


def backup_advice(
    events: list[BaseEvent], wall_s: float, *, mtbf_s: float | None = None, save_s: float | None = None
) -> dict[str, Any] | None:
    """The advice: its inputs, the optimum and what each interval loses; None with no input at all."""
    copies = [e for e in events if isinstance(e, kinds.BackupCopied)]
    cost = {"value_s": save_s, "source": "given", "n": None} if save_s is not None else save_cost(copies)
    mtbf = {"value_s": mtbf_s, "source": "given"} if mtbf_s is not None else run_mtbf(events, wall_s)
    now = interval_now(copies)
    if cost is None and mtbf.get("value_s") is None:
        return None
    out: dict[str, Any] = {"save_cost": cost, "mtbf": mtbf, "interval_now_s": _r(now), "optimal_interval_s": None}
    c, m = (cost or {}).get("value_s"), mtbf.get("value_s")
    if c is None or m is None:
        out["missing"] = "the save cost (no backup was copied)" if c is None else "the MTBF (no failure in this run)"
        return out
    best = young_daly(c, m)
    out["optimal_interval_s"] = _r(best)
    if best > 0:
        out["lost_at_optimum"] = round(lost_fraction(best, c, m), 5)
    if now is not None:
        out["lost_now"] = round(lost_fraction(now, c, m), 5)
    return out


def advice_lines(a: Mapping[str, Any] | None) -> list[str]:
    """The text of the advice (report and predict)."""
    if not a:
        return []
    cost, mtbf = a.get("save_cost") or {}, a.get("mtbf") or {}
    lines = ["backup interval (Young-Daly: √(2 · save cost · MTBF) maximises goodput):"]
    if cost.get("value_s") is not None:
        n = f", {cost['n']} backup(s)" if cost.get("n") else ""
        lines.append(f"  save cost {_dur(cost['value_s'])} ({cost['source']}{n})")
    if mtbf.get("value_s") is not None:
        fails = f", {mtbf['failures']} failure(s) in {_dur(mtbf['over_s'])}" if mtbf.get("failures") else ""
        lines.append(f"  MTBF {_dur(mtbf['value_s'])} ({mtbf['source']}{fails})")
    if a.get("missing"):
        hint = " (predict --mtbf 6h)" if "MTBF" in a["missing"] else " (predict --save-cost 30s)"
        more = f": none in {_dur(mtbf['over_s'])}" if "MTBF" in a["missing"] and mtbf.get("over_s") else ""
        lines.append(f"  unknown: {a['missing']}{more}; give it{hint}")
        return lines
    best = a["optimal_interval_s"]
    lines.append(
        f"  back up every {_dur(best)}: {100 * a.get('lost_at_optimum', 0.0):.2f}% of the time lost to saves and redone work"
    )
    if a.get("interval_now_s") is not None:
        lines.append(
            f"  now every {_dur(a['interval_now_s'])} (between copies): {100 * a['lost_now']:.2f}% lost"
            + ("; save less often" if a["interval_now_s"] < best else "; save more often")
        )
    return lines


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.2f} s" if s < 10 else f"{s:.0f} s"
