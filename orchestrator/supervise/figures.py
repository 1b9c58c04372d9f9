"""Each task's training figures — steps, step time, steps/s, examples/s, CPU, the step split — owned here.

A pure accumulator, fed the records of heartbeats.jsonl (heartbeats with their ``progress``, and
step-clock ``profile`` windows) in the order they arrived: the supervisor feeds it live, record by
record, and ``report`` feeds it the file. Same records, same order, same arithmetic: a finished run's
``status`` and its ``report`` show the same figures to the digit.

Rules, and why:

- **step time**: the step clock's, when there are ``profile`` windows — the step-weighted mean of
  the windows (``Split``), trimmed of odd steps by the step clock and unaffected by when records
  happen to be sent; else the median of the progress records' ``step_time_s``. (status used to show
  the last progress record's, a fraction of a second at the very end of training.)
- **steps/s, examples/s of a finished run**: over the job's **common training window**, per attempt:
  from the moment every task had reported a training step to the moment the first one stopped
  reporting; each task's cumulative counters interpolated at both ends. A synchronous job's workers
  step together, so they get the same rate; a per-task window from whichever record came first gave
  each worker its own mix of startup and training (8.0 vs 7.5 steps/s for one job). The attempts'
  windows add up (steps and seconds).
- **steps**: training steps made, over every attempt (each attempt's processes count from 0);
- **CPU**: the mean of the heartbeats' samples (periodic, so its CPU over the run);
- **live** (``live()``): the counters as they are now, the step time of the last progress record,
  rates over the last ≥ ``RATE_WINDOW_S``: what a running job is doing now.
- **loss** (the training loss, when the node reports one: cumulative sums, ``protocol.LossTotals``):
  live, the mean over the last interval between two records; for a finished run, the mean over its
  last ``LOSS_FINAL_SHARE`` of the steps (the run's curve: ``views.loss``).

Only ``train``-phase progress counts (evaluation has its own counters). Records carry the attempt
they belong to; an older file without it starts a new attempt where a task's heartbeat ``seq``
starts again. Memory stays bounded: a long attempt keeps every other progress point once it holds
``MAX_POINTS`` (the same records thin the same way, live or from the file).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runs import read_jsonl
from .series import LOSS_FINAL_SHARE, MAX_POINTS, PARTS, Point, Span, Split, _count, _Losses, _num

__all__ = ["LOSS_FINAL_SHARE", "MAX_POINTS", "PARTS", "Figures", "Point", "Split", "TaskFigures"]

RATE_WINDOW_S = 1.0  # live rates, and a finished attempt's common window, over at least this long
WARMUP_SHARE = 0.2  # with a warm-up cut (``final(warmup_s=...)``): at least this share of the window


@dataclass(frozen=True)
class TaskFigures:
    """A task's figures, as ``status`` and ``report`` show them (``split``: report's parts)."""

    steps: int | None = None
    epoch: int | None = None
    step_time_s: float | None = None
    steps_per_s: float | None = None
    examples_per_s: float | None = None
    cpu_pct: float | None = None
    split: dict[str, float] | None = None
    loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures ``status`` and ``report`` both show, under the same names."""
        return {
            "steps": self.steps,
            "step_time_s": self.step_time_s,
            "steps_per_s": self.steps_per_s,
            "examples_per_s": self.examples_per_s,
            "cpu_pct": self.cpu_pct,
            "loss": self.loss,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskFigures:
        """The figures of one task of status.json, read back by `status` into the type `report` shows
        (a value that is not a figure is None: the file is rewritten while it is read)."""
        loss = d.get("loss")
        return cls(
            steps=_count(d.get("steps")),
            epoch=_count(d.get("epoch")),
            step_time_s=_num(d.get("step_time_s")),
            steps_per_s=_num(d.get("steps_per_s")),
            examples_per_s=_num(d.get("examples_per_s")),
            cpu_pct=_num(d.get("cpu_pct")),
            loss=float(loss)
            if isinstance(loss, int | float) and not isinstance(loss, bool) and math.isfinite(loss)
            else None,
        )


#: The keys of ``TaskFigures.to_dict()``: the per-task figures status and report share.
FIGURE_KEYS = tuple(TaskFigures().to_dict())


class _Task:
    __slots__ = (
        "attempt",
        "base",
        "cpu_last",
        "cpu_n",
        "cpu_sum",
        "epoch",
        "losses",
        "rates",
        "row",
        "seq",
        "spans",
        "split",
    )

    def __init__(self) -> None:
        self.spans: dict[int, Span] = {}
        self.split = Split()
        self.cpu_sum = 0.0
        self.cpu_n = 0
        self.cpu_last: float | None = None
        self.epoch: int | None = None
        self.attempt = 0
        self.seq: int | None = None
        self.base: Point | None = None  # live rates: the point the current rate started from
        self.rates: tuple[float | None, float | None] = (None, None)
        self.losses = _Losses()
        self.row: dict[str, Any] | None = None  # ``live_row()`` as of the last record (``Figures.track_live``)

    def current(self) -> Point | None:
        span = self.spans.get(self.attempt)
        return span.points[-1] if span and span.points else None

    def live_row(self) -> dict[str, Any]:
        """The live figures under status.json's names (``epoch`` then ``TaskFigures.to_dict()``'s keys)."""
        now = self.current()
        base = self.base if now is None else None  # before the first step: the counters at 0
        return {
            "epoch": self.epoch,
            "steps": self.spans[self.attempt].top if now else (base.steps if base else None),
            "step_time_s": now.step_time_s if now else None,
            "steps_per_s": self.rates[0],
            "examples_per_s": self.rates[1],
            "cpu_pct": self.cpu_last,
            "loss": self.losses.last(),
        }


_NO_ROW: dict[str, Any] = {"epoch": None, **TaskFigures().to_dict()}


class Figures:
    """The accumulator: ``add`` records as they come, ``live`` while the job runs, ``final`` after it."""

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self._track_live = False

    def track_live(self) -> None:
        """Keep each task's live row up to date as its records come (the status snapshot asks for every
        task's every second: built here, where the task's state was just touched, it costs a fraction of
        building it later from state spread over memory). ``report``'s replay does not pay for it."""
        self._track_live = True
        for t in self._tasks.values():
            t.row = t.live_row()

    @classmethod
    def replay(cls, path: Path) -> Figures:
        """The figures of a run directory's heartbeats.jsonl so far (a continued run goes on from here)."""
        figs = cls()
        for rec in read_jsonl(path):
            if isinstance(rec.get("task"), str):
                figs.add(rec["task"], rec)
        return figs

    def add(self, task: str, rec: Mapping[str, Any]) -> None:
        """One heartbeats.jsonl record of ``task`` (a heartbeat, or a profile with ``kind: profile``)."""
        t = self._tasks.get(task)
        if t is None:  # not setdefault: a _Task built per record was a third of report's Figures time
            t = self._tasks[task] = _Task()
        get = rec.get
        attempt = _count(get("attempt"))
        if get("kind") == "profile":
            t.split.add(rec)
            return
        seq = _count(get("seq"))
        if attempt is None and seq is not None and t.seq is not None and seq < t.seq:
            attempt = t.attempt + 1  # an older file: a new worker_entry process counts from 0 again
        if seq is not None:
            t.seq = seq
        if attempt is not None and attempt != t.attempt:
            t.attempt, t.base, t.rates = attempt, None, (None, None)
        cpu = _num(get("cpu_pct"))
        if cpu is not None:
            t.cpu_sum, t.cpu_n, t.cpu_last = t.cpu_sum + cpu, t.cpu_n + 1, cpu
        prog = get("progress")
        if (type(prog) is dict or isinstance(prog, Mapping)) and prog.get("phase", "train") == "train":
            self._progress(t, prog, _num(get("ts")))
        if self._track_live:
            t.row = t.live_row()

    def _progress(self, t: _Task, prog: Mapping[str, Any], beat_ts: float | None) -> None:
        get = prog.get
        steps, ts = _count(get("steps")), _num(get("ts")) or beat_ts
        if steps is None or ts is None:
            return
        if (loss := get("loss")) is not None:
            t.losses.add(t.attempt, loss)
        epoch = _count(get("epoch"))
        if epoch is not None:
            t.epoch = epoch
        pt = Point(ts, steps, _count(get("examples")), _num(get("step_time_s")))
        if steps > 0:
            span = t.spans.get(t.attempt) or t.spans.setdefault(t.attempt, Span())  # a Span per record was slow
            span.add(pt)
        base = t.base
        if base is None or steps < base.steps or ts < base.ts:
            t.base = pt
        elif ts - base.ts >= RATE_WINDOW_S:
            dt = ts - base.ts
            ex = None if pt.examples is None or base.examples is None else round((pt.examples - base.examples) / dt, 1)
            t.rates, t.base = (round((steps - base.steps) / dt, 2), ex), pt

    # --- what a running job is doing now -------------------------------------------------------

    def live(self, task: str) -> TaskFigures:
        """(No ``split``: no live view shows it, ``final`` has it; a third of the status snapshot at 1,024 tasks.)"""
        return TaskFigures(**self.live_row(task))

    def live_row(self, task: str) -> dict[str, Any]:
        """``live(task)`` as status.json's fields (``epoch`` and ``FIGURE_KEYS``), without a dataclass per
        task per second; the caller's to read, not to change (it is the task's kept row)."""
        t = self._tasks.get(task)
        if t is None:
            return _NO_ROW
        return t.row if t.row is not None else t.live_row()

    def examples(self, task: str) -> int | None:
        """The examples ``task`` counted in its current attempt so far (a bound by examples)."""
        t = self._tasks.get(task)
        now = t.current() if t is not None else None
        return now.examples if now is not None else None

    # --- the whole run -------------------------------------------------------------------------

    def final(self, warmup_s: float = 0.0) -> dict[str, TaskFigures]:
        """Every task's figures over the whole run. ``warmup_s`` > 0 leaves each attempt's first
        max(``warmup_s``, WARMUP_SHARE of its window) out of the rates (a sweep's steady state)."""
        sums: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in self._tasks}  # steps, examples, seconds
        no_examples: set[str] = set()
        for attempt in sorted({a for t in self._tasks.values() for a in t.spans}):
            spans = {n: t.spans[attempt] for n, t in self._tasks.items() if t.spans.get(attempt)}
            window = _common_window(spans.values(), warmup_s)
            if window is None:
                continue
            lo, hi = window
            for name, span in spans.items():
                (s0, e0), (s1, e1) = span.at(lo), span.at(hi)
                acc = sums[name]
                acc[0] += s1 - s0
                acc[2] += hi - lo
                if e0 is None or e1 is None:
                    no_examples.add(name)
                else:
                    acc[1] += e1 - e0
        return {name: _final(t, sums[name], name in no_examples) for name, t in self._tasks.items()}


def _common_window(spans: Iterable[Span], warmup_s: float) -> tuple[float, float] | None:
    """The span every task of an attempt was training in: from the last first point to the first
    last point (None when shorter than RATE_WINDOW_S: nothing to measure a rate over)."""
    spans = list(spans)
    lo = max(s.points[0].ts for s in spans)
    hi = min(s.points[-1].ts for s in spans)
    if warmup_s > 0:
        cut = lo + max(warmup_s, WARMUP_SHARE * (hi - lo))
        lo = cut if hi - cut >= RATE_WINDOW_S else lo
    return (lo, hi) if hi - lo >= RATE_WINDOW_S else None


def _final(t: _Task, acc: Sequence[float], no_examples: bool) -> TaskFigures:
    """One task's whole-run figures, from the steps, examples and seconds of its common windows."""
    split = t.split.means()
    if split is not None:
        step_time = round(split["step_ms"] / 1000.0, 6)
    else:
        times = [p.step_time_s for s in t.spans.values() for p in s.points if p.step_time_s is not None]
        step_time = round(statistics.median(times), 6) if times else None
    made = [s.top for s in t.spans.values() if s.points]
    seconds = acc[2]
    return TaskFigures(
        steps=sum(made) if made else (0 if t.base is not None else None),
        epoch=t.epoch,
        step_time_s=step_time,
        steps_per_s=round(acc[0] / seconds, 3) if seconds > 0 else None,
        examples_per_s=round(acc[1] / seconds, 1) if seconds > 0 and not no_examples else None,
        cpu_pct=round(t.cpu_sum / t.cpu_n, 1) if t.cpu_n else None,
        split=split,
        loss=t.losses.final(),
    )


def job_step_ms(windows: Iterable[Mapping[str, Any]]) -> float:
    """The job's step time, in ms: the median of the workers' ``step_ms`` over one step-clock window
    each (a window without one counts as 0; 0.0 without windows). Under synchronous all-reduce every
    worker's step lasts as long as the job's, so one odd window does not move it. The one owner of
    this figure: the live monitor (stragglers, slowing), the evidence and ``report`` (pace) read it."""
    steps = [float(w.get("step_ms") or 0.0) for w in windows]
    return statistics.median(steps) if steps else 0.0


def job_rate(figures: Mapping[str, TaskFigures]) -> tuple[float | None, float | None]:
    """The job's (steps/s, examples/s): the workers' median (under MWMS every worker counts the
    global batch, so the job's rate is one worker's, never the sum)."""
    steps = [f.steps_per_s for f in figures.values() if f.steps_per_s is not None]
    examples = [f.examples_per_s for f in figures.values() if f.examples_per_s is not None]
    return _medians(steps, examples)


def _medians(steps: list[float], examples: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(steps) if steps else None, statistics.median(examples) if examples else None)


def throughput(figures: Mapping[str, TaskFigures]) -> dict[str, float | None]:
    """The job's rates as ``status``, ``report`` and the metrics show them beside each task's
    (``job_rate``: live figures while it runs, the whole run's after it)."""
    return _throughput(job_rate(figures))


def live_throughput(rows: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """``throughput`` of the tasks' live rows (``Figures.live_row``): the status snapshot's, every second."""
    steps, examples = [], []
    for r in rows:
        if (v := r["steps_per_s"]) is not None:
            steps.append(v)
        if (v := r["examples_per_s"]) is not None:
            examples.append(v)
    return _throughput(_medians(steps, examples))


def _throughput(rates: tuple[float | None, float | None]) -> dict[str, float | None]:
    steps, examples = rates
    return {
        "steps_per_s": None if steps is None else round(steps, 3),
        "examples_per_s": None if examples is None else round(examples, 1),
    }
