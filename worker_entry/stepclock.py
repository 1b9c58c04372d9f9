"""The step clock: straggler signals from timestamps taken inside the train step (no profiler).

Under synchronous all-reduce every worker's wall step time is the same (the fast workers wait inside the
collective for the slow one), so what tells a straggler apart is the time each worker spends *before*
it enters the gradient all-reduce. Three host timestamps per step (``tf.timestamp()``, seconds since
the epoch, the clock of ``time.time()``) split that time:

- ``t_data``: the batch is available to the train step (a stamp that depends on every input tensor,
  taken by a wrapper around the model instance's ``train_step``);
- ``t_enter``: every gradient is ready and the worker joins the all-reduce (a stamp that depends on
  every gradient; the all-reduce then consumes ``tf.identity`` copies of the gradients that depend on
  the stamp, so it cannot start before it);
- ``t_exit``: the reduced gradients are there.

They are taken in a wrapper around ``tf_keras``'s ``optimizers.utils.all_reduce_sum_gradients``
(``patch_optimizer_utils``: the new optimizers call it at call time, the legacy ``OptimizerV2`` stores
it as ``gradient_aggregator`` when constructed, so it is patched by a post-import hook right after the
module executes) and delivered after the all-reduce in program order. Delivery (``delivery()``):

- ``ring`` (default): the graph writes each stamp row into a per-replica ring of two local CPU
  variables (``assign_add`` + ``scatter_nd_update``); the callback reads the rings once per window.
- ``pyfunc`` (``TFCLUSTER_STEPCLOCK_DELIVERY=pyfunc``): ONE ``tf.py_function`` per step and replica
  appends the row to a deque. It costs a Python call on an executor thread at the tail of every step:
  ~0.15 ms in one process, ~0.35 ms (2.4 % of a 14 ms step) with 3 MWMS workers on 2 cores, against no
  measurable cost for the ring (docs/instrumentation.md).

Our stateful ops are exempt from the automatic control dependencies' program-order chain of stateful
ops without resource inputs (``run_independently``): chained, a stamp would wait for the stamps created
before it (the py_function, created before the all-reduce, would delay entering it; with several
replicas per worker, a replica's t_data would wait for the previous replica's t_enter).

The Keras callback (``progress.ProgressCallback``) stamps ``time.time()`` at ``on_train_batch_begin`` /
``_end`` and feeds ``StepClock``, which pairs the stamps with the steps and emits one ``profile`` record
(medians over the window) every ``TFCLUSTER_PROFILE_INTERVAL_S`` seconds.

In-graph stamps are added only while tracing a ``tf.function`` (not XLA-compiled) under a multi-worker
``MultiWorkerMirroredStrategy`` (``TFCLUSTER_STEPCLOCK=1``: under any strategy; ``0``: never), with a
positive ``TFCLUSTER_PROFILE_INTERVAL_S`` and without the TF-profiler opt-in (``TFCLUSTER_PROFILER=1``).
Anything failing while patching or tracing prints one ``tfcluster:`` warning and the step is built
exactly as without us: the all-reduce is never called twice and never gets different inputs.

The graph side (patches, stamps, delivery) is ``stamps.py``; this module pairs stamps with steps.
It imports TensorFlow only inside functions (``import worker_entry.stepclock`` stays cheap).
"""


from __future__ import annotations

import bisect
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import progress
from .progress import warn_once
from .stamps import (  # noqa: F401 - the step clock's public API lives here too
    Stamp,
    adopt_optimizer,
    delivered,
    delivery,
    drain,
    mode,
    patch_optimizer_utils,
    profiler_opt_in,
    wrap_all_reduce,
    wrap_train_step,
)

DEFAULT_MIN_STEPS = 10  # a window has at least this many steps
MAX_WINDOW = 4096  # steps kept per window (the newest)


# ------------------------------------------------------------------------------ pairing with steps


@dataclass(frozen=True)
class StepTimes:
    """One step's split (milliseconds); None where the stamp is missing."""

    step_ms: float
    pre_collective_ms: float | None = None
    input_ms: float | None = None
    compute_ms: float | None = None
    collective_ms: float | None = None


def _per_step(stamps: Sequence[Stamp]) -> list[list[Stamp]]:
    """Split one replica's stamps (in delivery order) into steps: a new step begins at call 0."""
    steps: list[list[Stamp]] = []
    for s in stamps:
        if s.call == 0 or not steps:
            steps.append([])
        steps[-1].append(s)
    return steps


def pair_execution(
    begin: float, end: float, steps: int, stamps: Sequence[Stamp], slack_s: float = 0.002
) -> list[StepTimes]:
    """The per-step split of one execution of the train function (``steps`` steps between the
    callback's ``begin`` and ``end``, seconds since the epoch) from the stamps it delivered.

    Replicas are aggregated per step: the last replica to get its batch (max t_data), to enter the
    all-reduce (max t_enter; with several all-reduces in a step, each replica's first) and to leave it.
    Step ``k > 0`` of a multi-step execution starts at step ``k - 1``'s t_exit (the callback only sees
    the execution's edges); every step gets the execution's mean ``step_ms``. Stamps outside
    [begin, end] (stale ones) are ignored; if the stamps do not split into ``steps`` steps on every
    replica, the execution yields only ``step_ms`` values.
    """
    steps = max(1, int(steps))
    step_ms = max(0.0, (end - begin) * 1e3 / steps)
    fresh = [s for s in stamps if s.t_enter >= begin - slack_s and s.t_exit <= end + slack_s]
    by_replica: dict[int, list[Stamp]] = {}
    for s in fresh:
        by_replica.setdefault(s.replica, []).append(s)
    split = {r: _per_step(v) for r, v in by_replica.items()}
    counts = {len(v) for v in split.values()}
    if not split or counts != {steps}:
        if split and steps == 1:
            split = {r: [[s for step in v for s in step]] for r, v in split.items()}
        else:
            return [StepTimes(step_ms) for _ in range(steps)]
    out: list[StepTimes] = []
    start = begin
    for k in range(steps):
        groups = [v[k] for v in split.values()]
        t_enter = max(min(s.t_enter for s in g) for g in groups)
        t_exit = max(max(s.t_exit for s in g) for g in groups)
        datas = [
            min(s.t_data for s in g if s.t_data is not None) for g in groups if any(s.t_data is not None for s in g)
        ]
        t_data = max(datas) if len(datas) == len(groups) else None
        out.append(
            StepTimes(
                step_ms=step_ms,
                pre_collective_ms=max(0.0, (t_enter - start) * 1e3),
                input_ms=None if t_data is None else max(0.0, (t_data - start) * 1e3),
                compute_ms=None if t_data is None else max(0.0, (t_enter - t_data) * 1e3),
                collective_ms=max(0.0, (t_exit - t_enter) * 1e3),
            )
        )
        start = t_exit
    return out


def pair_window(
    executions: Sequence[tuple[float, float, int]], stamps: Sequence[Stamp], slack_s: float = 0.002
) -> list[StepTimes]:
    """The per-step split of a window: ``executions`` are (begin, end, steps) of the train function's
    executions in order, ``stamps`` what the graph delivered meanwhile (in delivery order per replica);
    each stamp belongs to the execution during which it entered the all-reduce."""
    begins = [b for b, _, _ in executions]
    groups: list[list[Stamp]] = [[] for _ in executions]
    for st in stamps:
        i = bisect.bisect_right(begins, st.t_enter) - 1  # executions follow each other within ~0.1 ms
        if i >= 0 and st.t_enter <= executions[i][1] + slack_s:
            groups[i].append(st)
    out: list[StepTimes] = []
    for (begin, end, steps), group in zip(executions, groups, strict=True):
        out.extend(pair_execution(begin, end, steps, group, slack_s))
    return out


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


class StepClock:
    """Pairs the in-graph stamps with the callback's batch edges; emits one ``profile`` record (medians
    over the window) every ``interval_s`` seconds once the window has ``min_steps`` steps.

    Driven like the profiler sampler: ``on_batch_begin()`` before and ``on_batch_end(steps)`` after each
    execution of the train function; ``close()`` at the end of training. Per step it only reads the
    clock twice; the stamps are taken (``take``, default ``drain``) and paired once per window. The
    first execution (tracing, collective setup) is left out. Never raises: a failure prints one
    warning and disables it.
    """

    source = "stepclock"

    def __init__(
        self,
        interval_s: float,
        min_steps: int = DEFAULT_MIN_STEPS,
        emit: Callable[..., Any] = progress.emit,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        take: Callable[[], list[Stamp]] = drain,
        skip_executions: int = 1,
    ) -> None:
        self.interval_s = interval_s
        self.min_steps = max(1, int(min_steps))
        self.enabled = interval_s > 0
        self._emit = emit
        self._wall = wall
        self._clock = clock
        self._cpu = cpu
        self._take = take
        self._skip = max(0, int(skip_executions))
        self._begin: float | None = None
        self._executions: deque[tuple[float, float, int]] = deque(maxlen=MAX_WINDOW)
        self._window_steps = 0  # every step of the window (for cpu_ms), even beyond MAX_WINDOW
        self._window_start = clock()
        self._cpu0 = cpu()
        self.windows = 0
        self.last_record: dict[str, Any] | None = None
        if self.enabled:
            self._reset()  # stamps of an earlier fit or loop are not ours

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **kwargs: Any) -> StepClock:
        return cls(progress.profile_interval_from_env(env) if mode(env) != "off" else 0.0, **kwargs)

    def _disable(self, exc: BaseException) -> None:
        self.enabled = False
        warn_once("stepclock", f"step clock disabled ({exc!r}); training continues")

    def on_batch_begin(self) -> None:
        if self.enabled:
            self._begin = self._wall()

    def on_batch_end(self, steps: int = 1) -> None:
        if not self.enabled:
            return
        end = self._wall()
        begin, self._begin = self._begin, None
        if begin is None:
            return
        try:
            if self._skip > 0:
                self._skip -= 1
                self._reset()
                return
            steps = max(1, int(steps))
            self._executions.append((begin, end, steps))
            self._window_steps += steps
            if self._window_steps >= self.min_steps and self._clock() - self._window_start >= self.interval_s:
                self._flush()
        except Exception as exc:
            self._disable(exc)

    def _reset(self) -> None:
        try:
            self._take()  # what was delivered before this window
        except Exception as exc:
            self._disable(exc)
        self._executions.clear()
        self._window_steps = 0
        self._window_start = self._clock()
        self._cpu0 = self._cpu()

    def summary(self, steps: Sequence[StepTimes]) -> dict[str, Any]:
        """The record for a window's steps (medians of the per-step values)."""
        cpu = self._cpu() - self._cpu0
        return {
            "steps": len(steps),
            "step_ms": _median([s.step_ms for s in steps]),
            "pre_collective_ms": _median([s.pre_collective_ms for s in steps]),
            "input_ms": _median([s.input_ms for s in steps]),
            "compute_ms": _median([s.compute_ms for s in steps]),
            "collective_ms": _median([s.collective_ms for s in steps]),
            "cpu_ms": round(cpu * 1e3 / self._window_steps, 3) if self._window_steps else None,
            "source": self.source,
        }

    def _flush(self) -> None:
        record = self.summary(pair_window(list(self._executions), self._take()))
        self._reset()
        self.windows += 1
        self.last_record = record
        self._emit("profile", **record)

    def close(self) -> None:
        """End of training: the partial window is dropped (it may hold the last, uneven steps)."""
        self._executions.clear()
        self.enabled = False


def sampler_from_env(env: Mapping[str, str] = os.environ, tf_profiler: bool = True) -> Any:
    """What produces ``profile`` records for a Keras fit: the step clock (default), or the TF-profiler
    sampler with ``TFCLUSTER_PROFILER=1`` (``tf_profiler=False``: another callback profiles; none then).
    None when neither is enabled."""
    if profiler_opt_in(env):
        if not tf_profiler:
            return None
        from .profiling import ProfileSampler

        sampler = ProfileSampler.from_env(env)
    else:
        sampler = StepClock.from_env(env)
    return sampler if sampler.enabled else None
