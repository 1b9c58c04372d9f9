"""The step clock's arithmetic: stamp rows → steps → one ``profile`` record per window. Pure Python.

The graph (``stamps.py``) writes, per local replica and in program order, a row for each collective
(``t_enter``, ``t_exit``) and, when a replica function's work is done, one for the function: when it
started (``t_start``), got its batch (``t_data``) and finished its work (``t_done``, after the
optimizer and metric updates).
A **step** is the span between two consecutive *primary* collective exits (the function's largest
gradient all-reduces): with gradient accumulation every k-th execution all-reduces, and the k-1
executions in between belong to the step that ends with it.

Every instant of a step is attributed to exactly one part, by the state the replica is in, so the
parts add up to the step by construction and each is measured between two stamps:

==========  ===============================================================================
input       the function started but its batch is not there yet (``t_start``→``t_data``), and
            eager ``next()`` calls on a distributed iterator between executions (host-timed)
compute     the batch is there, the step's gradient all-reduce not done yet, not in a collective
collective  inside any collective (the all-reduce itself plus waiting for the slowest peer)
update      after the gradient all-reduce, until the replica function's work is done
            (optimizer update, metric updates)
host        between the replica function's end and the next one's start: framework overhead,
            the training loop's Python, host callbacks, other graph work after ``strategy.run``
other       outside collectives where no replica-function stamps exist (e.g. the function
            passed to ``strategy.run`` was itself a ``tf.function``)
==========  ===============================================================================
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .ring import COLLECTIVE, IN_RUN, RUN, Row

CATEGORIES = ("input", "compute", "collective", "update", "host", "other")
DEFAULT_MIN_STEPS = 5
MAX_WINDOW = 4096  # steps kept per window (the newest)
TRIM = 0.1  # trimmed means: drop the fastest and slowest 10 % of a window's steps
_START, _DATA, _ENTER, _EXIT, _DONE, _ENTER_FREE, _EXIT_FREE = range(7)


@dataclass
class StepSplit:
    """One step of one replica: its duration and parts (milliseconds; the parts sum to ``step_ms``)."""

    fn: int
    end: float  # t_exit of the primary collective that ends it (seconds since the epoch)
    step_ms: float
    parts: dict[str, float]
    warmup: bool = False  # the first step of a function (tracing, collective setup): not in windows
    examples: float | None = None  # examples of the step across the replicas in sync (None: unknown)
    sq: tuple[float, float] | None = None  # its gradient all-reduces' Σ|local|², Σ|reduced/d|² (None: none)
    sq_bad: bool = False  # a norm was not finite (an overflow step): left out of the noise scale

    @property
    def local_ms(self) -> float:
        """Everything outside collectives: the time this replica works between two all-reduces."""
        return self.step_ms - self.parts["collective"]


@dataclass
class _State:
    in_run: bool = False
    have_data: bool = False
    primary_done: bool = False
    open_run: int = 0  # collectives issued by the replica function, open now
    open_free: int = 0  # collectives outside it (strategy.reduce of the loss ...), open now
    seen_run: bool = False

    def category(self) -> str:
        """Inside a replica function its own phase rules: a collective issued outside it (the loss's
        strategy.reduce, which may start as soon as the loss exists) runs concurrently with the work
        and counts only once the function is done and the worker waits for it."""
        if self.open_run > 0:
            return "collective"
        if self.in_run:
            if not self.have_data:
                return "input"
            return "update" if self.primary_done else "compute"
        if self.open_free > 0:
            return "collective"
        return "host" if self.seen_run else "other"


@dataclass
class Timeline:
    """One replica's rows → steps, incrementally. ``primaries(fn)`` names the step-ending calls;
    ``has_runs(fn)``: a RUN row follows the collectives of a run of ``fn`` (close its steps then);
    ``solo(fn)``: one replica in all, TF skipped the gradient reduction: each run of ``fn`` is a step."""

    primaries: Callable[[int], frozenset[int]]
    has_runs: Callable[[int], bool] = lambda fn: False
    solo: Callable[[int], bool] = lambda fn: False  # one replica in all: each run of fn is a step
    _events: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, order, kind, fn)
    _closes: list[tuple[float, int]] = field(default_factory=list)  # primary exits waiting for their run
    _inputs: list[tuple[float, float]] = field(default_factory=list)
    _state: _State = field(default_factory=_State)
    _t: float | None = None  # accounted up to here
    _cut: float | None = None  # the end of the last step
    _acc: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    _fns_seen: set[int] = field(default_factory=set)
    _order: int = 0
    _first: float = float("inf")
    _examples: float = 0.0  # of the replica-function executions since the last step
    _sq: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # Σ local, Σ total, rows since the last step
    _sq_bad: bool = False

    def feed(self, rows: Iterable[Row], inputs: Sequence[tuple[float, float]] = ()) -> list[StepSplit]:
        """Add rows (write order) and eager input intervals; return the steps they complete."""
        for a, b in inputs:
            if b > a:
                bisect.insort(self._inputs, (a, b))
        out: list[StepSplit] = []
        for r in rows:
            self._norms(r)
            if r.code == RUN:
                self._examples += r.examples  # this execution's batch belongs to the step it ends (or the next)
                start = min(r.a, r.b, r.c)
                self._push(start, _START, r.fn)
                self._push(min(max(r.b, start), r.c), _DATA, r.fn)
                self._push(r.c, _DONE, r.fn)
                primaries = self.primaries(r.fn)
                if not primaries and self.solo(r.fn):
                    self._closes.append((r.c, r.fn))  # no all-reduce at one replica: the run ends the step
                for call, t_enter, t_exit in r.inline:
                    self._push(t_enter, _ENTER, r.fn)
                    if call in primaries:
                        self._closes.append((max(t_enter, t_exit), r.fn))
                    else:
                        self._push(max(t_enter, t_exit), _EXIT, r.fn)
                known = self._examples > 0  # several steps closed by one row: the first takes the batch
                closing = sorted(self._closes)
                for i, (t_exit, fn) in enumerate(closing):
                    step = self._close(t_exit, fn)
                    step.examples = (self._examples if i == 0 else 0.0) if known else None
                    self._give_norms(step, len(closing))
                    out.append(step)
                if self._closes:
                    self._examples = 0.0
                    self._sq, self._sq_bad = [0.0, 0.0, 0.0], False
                self._closes.clear()
            elif r.code in (COLLECTIVE, IN_RUN):
                primary = r.call in self.primaries(r.fn)
                runs = self.has_runs(r.fn)
                # a collective outside the replica function, unless it is a step's all-reduce of a
                # function without replica-function stamps (then nothing else marks the work)
                free = r.code == COLLECTIVE and not (primary and not runs)
                self._push(r.a, _ENTER_FREE if free else _ENTER, r.fn)
                t_exit = max(r.a, r.b)
                if not primary:
                    self._push(t_exit, _EXIT_FREE if free else _EXIT, r.fn)
                elif runs:
                    self._closes.append((t_exit, r.fn))  # closed when its function's RUN row arrives
                else:
                    step = self._close(t_exit, r.fn)
                    self._give_norms(step, 1)
                    self._sq, self._sq_bad = [0.0, 0.0, 0.0], False
                    out.append(step)
        return out

    def _norms(self, r: Row) -> None:
        """The squared norms a row carries go to the step it ends (or the next one)."""
        if r.local_sq == -1.0 and r.total_sq == -1.0:
            return
        if math.isfinite(r.local_sq) and math.isfinite(r.total_sq) and r.local_sq >= 0 and r.total_sq >= 0:
            self._sq = [self._sq[0] + r.local_sq, self._sq[1] + r.total_sq, self._sq[2] + 1]
        else:
            self._sq_bad = True

    def _give_norms(self, step: StepSplit, shared: int) -> None:
        """Several steps closed by one row (a loop unrolled in one replica function) share its norms."""
        step.sq_bad = self._sq_bad
        if self._sq[2] and not self._sq_bad:
            step.sq = (self._sq[0] / shared, self._sq[1] / shared)

    def _push(self, t: float, kind: int, fn: int) -> None:
        self._order += 1
        self._events.append((t, self._order, kind, fn))

    def _close(self, t_exit: float, fn: int) -> StepSplit:
        self._events.sort()
        keep = []
        for ev in self._events:
            if ev[0] <= t_exit:
                self._apply(ev)
            else:
                keep.append(ev)
        self._events = keep
        self._account(t_exit)
        start = self._cut if self._cut is not None else min(self._first, t_exit)
        self._cut = t_exit
        self._state.open_run = max(0, self._state.open_run - 1)
        self._state.primary_done = True
        parts = {k: round(v * 1e3, 6) for k, v in self._acc.items()}
        self._acc = dict.fromkeys(CATEGORIES, 0.0)
        warmup = fn not in self._fns_seen
        self._fns_seen.add(fn)
        self._prune_inputs(t_exit)
        return StepSplit(fn, t_exit, round((t_exit - start) * 1e3, 6), parts, warmup)

    def _apply(self, ev: tuple[float, int, int, int]) -> None:
        t, _, kind, _fn = ev
        if self._t is None:
            self._t = self._first = t
        self._account(t)
        s = self._state
        if kind == _START:
            s.in_run, s.have_data, s.primary_done, s.seen_run = True, False, False, True
        elif kind == _DATA:
            s.have_data = True
        elif kind == _ENTER:
            s.open_run += 1
            s.have_data = True  # a collective of the run: its batch was there (t_data may be stamped late)
        elif kind == _EXIT:
            s.open_run = max(0, s.open_run - 1)
        elif kind == _ENTER_FREE:
            s.open_free += 1
        elif kind == _EXIT_FREE:
            s.open_free = max(0, s.open_free - 1)
        elif kind == _DONE:
            s.in_run = False
            s.open_run = 0

    def _account(self, t: float) -> None:
        """Attribute [self._t, t] to the current state's part."""
        if self._t is None:
            self._t = t
            return
        if t <= self._t:
            return
        cat = self._state.category()
        if cat == "host" and self._inputs:
            fetched = self._overlap(self._t, t)
            self._acc["input"] += fetched
            self._acc["host"] += (t - self._t) - fetched
        else:
            self._acc[cat] += t - self._t
        self._t = t

    def _overlap(self, a: float, b: float) -> float:
        total = 0.0
        i = max(0, bisect.bisect_left(self._inputs, (a, a)) - 1)
        for x, y in self._inputs[i:]:
            if x >= b:
                break
            total += max(0.0, min(b, y) - max(a, x))
        return min(total, b - a)

    def _prune_inputs(self, t: float) -> None:
        self._inputs = [iv for iv in self._inputs if iv[1] > t]


def trimmed(steps: Sequence[StepSplit], trim: float = TRIM) -> list[StepSplit]:
    """The window's steps without the fastest and slowest ``trim`` share (when there are ≥ 10)."""
    ordered = sorted(steps, key=lambda s: s.step_ms)
    k = int(len(ordered) * trim) if len(ordered) >= 10 else 0
    return ordered[k : len(ordered) - k] if k else ordered


def summarize(steps: Sequence[StepSplit], cpu_s: float | None = None, counted: int | None = None) -> dict:
    """One window's record: means over the trimmed steps (additive: the parts sum to ``step_ms``),
    ``pre_collective_ms`` = time outside collectives (this worker's own work per step, the straggler
    signal), ``cpu_ms`` = process CPU time per step over the window."""
    kept = trimmed(steps)
    n = len(kept)
    rec: dict = {"steps": counted if counted is not None else len(steps), "source": "stepclock"}
    if not n:
        return rec
    means = {k: sum(s.parts[k] for s in kept) / n for k in CATEGORIES}
    rec["step_ms"] = round(sum(s.step_ms for s in kept) / n, 3)
    for k in CATEGORIES:
        rec[f"{k}_ms"] = round(means[k], 3)
    rec["pre_collective_ms"] = round(rec["step_ms"] - means["collective"], 3)
    rec["step_p50_ms"] = round(statistics.median(s.step_ms for s in steps), 3)
    total = counted if counted is not None else len(steps)
    if cpu_s is not None and total:
        rec["cpu_ms"] = round(cpu_s * 1e3 / total, 3)
    return rec


def median_batch(windows: Iterable[Sequence[StepSplit]]) -> float | None:
    """The global batch of the window's median step: each local replica's median step examples (its share
    of the replicas in sync), summed. The median, not the mean: an epoch's partial last batch (6,000 mod
    192 = 48) would pull a mean below the batch the script asked for. None when a step's examples are unknown."""
    total, any_ = 0.0, False
    for w in windows:
        ex = [s.examples for s in w]
        if not ex:
            continue
        if any(e is None for e in ex):
            return None
        total += statistics.median(ex)  # type: ignore[type-var]
        any_ = True
    return round(total, 3) if any_ else None


def noise(windows: Sequence[Sequence[StepSplit]]) -> dict | None:
    """One worker's noise-scale inputs over a window (``protocol.GradNoise``): untrimmed means over the
    steps with norms (the sampled ones: a row without norms is skipped, never read as 0) and finite
    ones — the estimator is linear in them, trimming would bias it — of the mean
    over the local replicas of |g_i|² and of |R/d|², with their per-step (co)variances (the replicas
    taken as independent: a replica's own variance over their number); None without norms."""
    rows = [s for w in windows for s in w if s.sq is not None]
    if not rows:
        return None
    # the local replicas: every replica with steps in the window, sampled or not (with the norms on every
    # k-th step one replica's window may end just before a sampled step its neighbour's took)
    replicas = max(1, sum(1 for w in windows if w))
    n = len(rows)
    local = sum(s.sq[0] for s in rows) / n  # type: ignore[index]
    total = sum(s.sq[1] for s in rows) / n  # type: ignore[index]
    out: dict = {
        "steps": max(1, n // replicas),
        "local_sq": local,
        "total_sq": total,
        "nonfinite": max(sum(1 for s in w if s.sq_bad) for w in windows),
    }
    if n >= 2:
        dl = [s.sq[0] - local for s in rows]  # type: ignore[index]
        dt = [s.sq[1] - total for s in rows]  # type: ignore[index]
        out["var_local"] = sum(x * x for x in dl) / (n - 1) / replicas
        out["var_total"] = sum(x * x for x in dt) / (n - 1)
        out["cov"] = sum(a * b for a, b in zip(dl, dt, strict=True)) / (n - 1)
    examples = [s.examples for s in rows]
    if all(e is not None and e > 0 for e in examples):  # a replica's step carries its share of the batch
        out["batch"] = sum(examples) / n * replicas  # type: ignore[arg-type]
    return out
