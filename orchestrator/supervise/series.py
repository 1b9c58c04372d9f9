"""A task's series, as the figures keep them: its progress points per attempt (thinned past
``MAX_POINTS``), its cumulative training loss, its step-clock split. Pure; ``figures`` owns what they
mean (the rules in its docstring); split from it so each stays one responsibility under the line cap.

The objects are slotted: the launcher touches one task's of each per record, and at 4,096 tasks the
memory they are spread over, not the arithmetic, is most of their cost.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MAX_POINTS = 2048  # progress points kept per task and attempt before thinning
PARTS = ("input_ms", "compute_ms", "collective_ms", "update_ms", "host_ms", "other_ms")
LOSS_FINAL_SHARE = 0.1
_KNOWN = PARTS[:-1]  # the parts a window states; ``other`` is its step minus them without the step clock's


def _num(x: Any) -> float | None:
    """A finite non-negative number, else None (a damaged file's records must not raise); JSON's types first."""
    t = type(x)
    if t is float:
        return x if 0.0 <= x < math.inf else None  # NaN fails both comparisons
    if t is int:
        return float(x) if x >= 0 else None
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0:
        return float(x)
    return None


def _count(x: Any) -> int | None:
    if type(x) is int:
        return x if x >= 0 else None
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


class Split:
    """Step-weighted means of a task's step-clock windows: the parts of its step (they add up to it).
    A window without the step clock's parts (older, or the TF profiler's) counts with ``other`` = its
    step minus the parts it has."""

    __slots__ = ("_means", "steps", "sums")

    def __init__(self) -> None:
        self.steps = 0.0
        self.sums = dict.fromkeys(("step_ms", *PARTS), 0.0)
        self._means: dict[str, float] | None = None  # kept until the next window: a snapshot a second asks

    def add(self, rec: Mapping[str, Any]) -> None:
        get = rec.get
        n, step = _num(get("steps")) or 0, _num(get("step_ms"))
        if not n or step is None or _num(get("collective_ms")) is None:
            return
        sums, self._means = self.sums, None
        known = 0.0
        for k in _KNOWN:
            v = _num(get(k)) or 0.0
            known += v
            sums[k] += n * v
        other = max(0.0, step - known) if _num(get("update_ms")) is None else (_num(get("other_ms")) or 0.0)
        self.steps += n
        sums["step_ms"] += n * step
        sums["other_ms"] += n * other

    def means(self) -> dict[str, float] | None:
        if self.steps > 0 and self._means is None:
            out = self._means = {k: round(v / self.steps, 3) for k, v in self.sums.items()}
            out["pre_collective_ms"] = round(out["step_ms"] - out["collective_ms"], 3)
        return dict(self._means) if self._means is not None else None  # a copy: the caller's to keep


class Point(NamedTuple):
    """One progress record: cumulative training counters at ``ts`` (the node's clock); a tuple: 4x cheaper."""

    ts: float
    steps: int
    examples: int | None
    step_time_s: float | None


@dataclass(slots=True)
class Span:
    """One task's training points in one attempt (thinned past MAX_POINTS; first and last kept)."""

    points: list[Point] = field(default_factory=list)
    top: int = 0  # the most steps any record said: the steps made, whatever its time

    def add(self, pt: Point) -> None:
        points = self.points
        if pt.steps > self.top:
            self.top = pt.steps
        if points:
            last = points[-1]
            if pt.ts <= last.ts or pt.steps < last.steps:
                return  # the same record again (every heartbeat carries the last one), or out of order
        points.append(pt)
        if len(points) > MAX_POINTS:
            self.points = [*points[:-1:2], points[-1]]

    def at(self, ts: float) -> tuple[float, float | None]:
        """(steps, examples) at ``ts``, interpolated between the points around it."""
        pts = self.points
        i = bisect.bisect_left([p.ts for p in pts], ts)
        if i >= len(pts):
            a = b = pts[-1]
        elif pts[i].ts == ts or i == 0:
            a = b = pts[i]
        else:
            a, b = pts[i - 1], pts[i]
        f = 0.0 if b.ts == a.ts else (ts - a.ts) / (b.ts - a.ts)
        steps = a.steps + f * (b.steps - a.steps)
        ex = None if a.examples is None or b.examples is None else a.examples + f * (b.examples - a.examples)
        return steps, ex


class _Losses:
    """A task's cumulative training loss (sum, steps) over its attempts, thinned like its progress."""

    __slots__ = ("attempt", "offset", "points")

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []  # (Σ loss, steps), every attempt counted on
        self.offset = (0.0, 0.0)
        self.attempt: int | None = None

    def add(self, attempt: int, loss: Any) -> None:
        if not isinstance(loss, Mapping):
            return
        total, n = loss.get("sum"), _num(loss.get("steps"))
        if not isinstance(total, (int, float)) or isinstance(total, bool) or not math.isfinite(total) or not n:
            return
        if self.attempt is not None and attempt != self.attempt and self.points:
            self.offset = self.points[-1]
        self.attempt = attempt
        pt = (self.offset[0] + float(total), self.offset[1] + n)
        if self.points and pt[1] <= self.points[-1][1]:
            return
        self.points.append(pt)
        if len(self.points) > MAX_POINTS:
            self.points = [*self.points[:-1:2], self.points[-1]]

    def last(self) -> float | None:
        """The mean loss over the last interval between two records."""
        if len(self.points) < 2:
            return _mean((0.0, 0.0), self.points[-1]) if self.points else None
        return _mean(self.points[-2], self.points[-1])

    def final(self) -> float | None:
        """The mean loss over the last LOSS_FINAL_SHARE of the steps (at least the last interval)."""
        if not self.points:
            return None
        end = self.points[-1]
        cut = end[1] * (1 - LOSS_FINAL_SHARE)
        start = next((p for p in reversed(self.points[:-1]) if p[1] <= cut), None)
        start = start or (self.points[-2] if len(self.points) >= 2 else (0.0, 0.0))
        return _mean(start, end)


def _mean(a: tuple[float, float], b: tuple[float, float]) -> float | None:
    return (b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else None
