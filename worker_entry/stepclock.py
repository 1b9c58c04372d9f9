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

This module imports TensorFlow only inside functions (``import worker_entry.stepclock`` stays cheap).
"""

from __future__ import annotations

import bisect
import functools
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import progress
from .progress import warn_once

ENV_MODE = "TFCLUSTER_STEPCLOCK"  # auto (default) | 1 (any strategy) | 0 (off)
ENV_PROFILER = "TFCLUSTER_PROFILER"  # 1: the TF-profiler sampler instead (crash-prone, see profiling.py)
ENV_DELIVERY = "TFCLUSTER_STEPCLOCK_DELIVERY"  # ring (default) | pyfunc
DEFAULT_MIN_STEPS = 10  # a window has at least this many steps
RING_SIZE = 4096  # stamps kept per replica until the callback reads them (older ones are overwritten)
MAX_PENDING = 4096  # py_function delivery: stamps waiting for the callback (bounded)
MAX_WINDOW = 4096  # steps kept per window (the newest)
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on", "force")
_WRAPPED = "_tfcluster_stepclock"
_MISSING = -1.0  # t_data when no train_step stamp exists in the graph


# ------------------------------------------------------------------------------------ configuration


def profiler_opt_in(env: Mapping[str, str] = os.environ) -> bool:
    """``TFCLUSTER_PROFILER=1``: sample the TF profiler instead of the step clock (see profiling.py)."""
    from .profiling import opted_in

    return opted_in(env)


def mode(env: Mapping[str, str] = os.environ) -> str:
    """``off``, ``auto`` (multi-worker MWMS only) or ``force`` (any strategy), from the environment."""
    raw = (env.get(ENV_MODE) or "auto").strip().lower()
    if raw in _OFF or progress.profile_interval_from_env(env) <= 0 or profiler_opt_in(env):
        return "off"
    if raw in _ON:
        return "force"
    return "auto"


def _is_multi_worker_mwms(strategy: Any) -> bool:
    extended = getattr(strategy, "extended", None)
    names = {c.__name__ for c in type(extended).__mro__}
    if "CollectiveAllReduceExtended" not in names:
        return False
    in_mw = getattr(extended, "_in_multi_worker_mode", None)
    return bool(in_mw()) if callable(in_mw) else False


def _bytes_per_pack(strategy: Any) -> int:
    options = getattr(getattr(strategy, "extended", None), "_communication_options", None)
    try:
        return int(getattr(options, "bytes_per_pack", 0) or 0)
    except (TypeError, ValueError):
        return 0


def _tracing_context() -> tuple[Any, Any, Any] | None:
    """(tf, graph, strategy) when stamps belong in the step being traced now, else None."""
    m = mode()
    if m == "off":
        return None
    import tensorflow as tf
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    if not tf.inside_function() or not ops.executing_eagerly_outside_functions():
        return None  # eager steps have no graph to stamp; TF1 graph mode is not supported
    graph = ops.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        return None  # jit_compile: XLA cannot compile Timestamp / EagerPyFunc
    if tf.distribute.in_cross_replica_context():
        return None
    strategy = tf.distribute.get_strategy()
    if m == "auto" and not _is_multi_worker_mwms(strategy):
        return None
    return tf, graph, strategy


# ------------------------------------------------------------------------- stamps from the graph


class Stamp(NamedTuple):
    """One all-reduce of one replica in one step, as delivered from the graph."""

    replica: int
    call: int  # index of this all-reduce among those of the traced step (0 = the first)
    t_data: float | None
    t_enter: float
    t_exit: float


def delivery(env: Mapping[str, str] = os.environ) -> str:
    """How stamps leave the graph: ``ring`` (default) or ``pyfunc`` (see the module docstring)."""
    return "pyfunc" if (env.get(ENV_DELIVERY) or "").strip().lower() == "pyfunc" else "ring"


class _Ring:
    """One replica's stamps in two local CPU variables: a counter and ``RING_SIZE`` rows of
    (call, t_data, t_enter, t_exit). Written by the graph (``assign_add`` + ``scatter_nd_update``,
    ~10 us per step), read by the callback once per window."""

    def __init__(self, tf: Any, replica: int) -> None:
        from tensorflow.python.ops import resource_variable_ops

        self.replica = replica
        self.read_upto = 0  # rows below this count have been taken
        # Created eagerly (init_scope), on this host's CPU, and as a plain ResourceVariable (which
        # bypasses variable creator scopes): never a distributed variable, never in a checkpoint.
        with tf.init_scope(), tf.device("/cpu:0"):
            self.count = resource_variable_ops.ResourceVariable(
                tf.constant(0, tf.int64), trainable=False, name=f"tfcluster_stamps_count_{replica}"
            )
            self.rows = resource_variable_ops.ResourceVariable(
                tf.zeros([RING_SIZE, 4], tf.float64), trainable=False, name=f"tfcluster_stamps_{replica}"
            )

    def write(self, tf: Any, call: int, stamps: Any) -> None:
        n = self.count.assign_add(1)
        index = tf.reshape((n - 1) % RING_SIZE, [1, 1])
        row = tf.reshape(tf.concat([tf.constant([call], tf.float64), stamps], 0), [1, 4])
        self.rows.scatter_nd_update(index, row)

    def take(self) -> list[Stamp]:
        count = int(self.count.numpy())
        rows = self.rows.numpy()
        start = max(self.read_upto, count - RING_SIZE)
        self.read_upto = count
        out = []
        for i in range(start, count):
            call, t_data, t_enter, t_exit = (float(x) for x in rows[i % RING_SIZE])
            out.append(Stamp(self.replica, int(call), t_data if t_data >= 0 else None, t_enter, t_exit))
        return out


_rings: dict[int, _Ring] = {}
_rings_lock = threading.Lock()
_pending: deque[Stamp] = deque(maxlen=MAX_PENDING)
_counts = {"pyfunc": 0}


def _ring(tf: Any, replica: int) -> _Ring:
    with _rings_lock:
        ring = _rings.get(replica)
        if ring is None:
            ring = _rings[replica] = _Ring(tf, replica)
        return ring


def _deliver(replica: int, call: int, stamps: Any) -> None:
    """Body of the py_function delivery: runs on a TF executor thread; must never raise."""
    try:
        t_data, t_enter, t_exit = (float(x) for x in stamps.numpy())
        _pending.append(Stamp(replica, call, t_data if t_data >= 0 else None, t_enter, t_exit))
        _counts["pyfunc"] += 1
    except Exception:
        pass


def delivered() -> int:
    """How many stamps the graph has delivered in this process (tests, diagnostics)."""
    with _rings_lock:
        rings = list(_rings.values())
    return _counts["pyfunc"] + sum(int(r.count.numpy()) for r in rings)


def drain() -> list[Stamp]:
    """Take every stamp delivered since the last call (per replica in delivery order). Call it from
    the training loop's thread between steps (it reads the ring variables eagerly)."""
    out: list[Stamp] = []
    while True:
        try:
            out.append(_pending.popleft())
        except IndexError:
            break
    with _rings_lock:
        rings = list(_rings.values())
    for ring in rings:
        out.extend(ring.take())
    return out


# trace-time stash: (id(graph), thread) -> {"t_data": tensor, "calls": int}
_stash: dict[tuple[int, int], dict[str, Any]] = {}
_stash_lock = threading.Lock()


def _key(graph: Any) -> tuple[int, int]:
    return id(graph), threading.get_ident()


def _independent(*tensors_or_ops: Any) -> None:
    """Exempt our stamps and the py_function from the automatic control dependencies' program-order
    chain of stateful ops without resource inputs: chained, a replica's t_data would wait for the
    stamps created before it (with several replicas per worker, for another replica's t_enter)."""
    from tensorflow.python.framework import ops

    manager = getattr(ops.get_default_graph(), "experimental_acd_manager", None)
    run_independently = getattr(manager, "run_independently", None)
    if run_independently is None:
        return
    for x in tensors_or_ops:
        op = x if isinstance(x, ops.Operation) else getattr(x, "op", None)
        if op is not None:
            run_independently(op)


def _begin_step(data: Any) -> tuple[int, int] | None:
    """In a wrapped train_step being traced: stamp the arrival of ``data`` and stash it."""
    ctx = _tracing_context()
    if ctx is None:
        return None
    tf, graph, _ = ctx
    flat = [t for t in tf.nest.flatten(data, expand_composites=True) if isinstance(t, tf.Tensor)]
    with tf.control_dependencies(flat), tf.device("/cpu:0"):
        t_data = tf.timestamp(name="tfcluster_t_data")
    _independent(t_data)
    key = _key(graph)
    with _stash_lock:
        _stash[key] = {"t_data": t_data, "calls": 0}
    return key


def _end_step(key: tuple[int, int] | None) -> None:
    if key is not None:
        with _stash_lock:
            _stash.pop(key, None)


def _replica_id(tf: Any) -> int:
    ctx = tf.distribute.get_replica_context()
    rid = getattr(ctx, "_replica_id_in_sync_group", 0)
    return rid if isinstance(rid, int) else 0


@dataclass
class _Pending:
    tf: Any
    t_data: Any
    t_enter: Any
    replica: int
    call: int


def _dense(g: Any, tf: Any) -> Any:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _before(grads_and_vars: list) -> tuple[list, _Pending] | None:
    """Stamp t_enter after every gradient; gradients for the all-reduce that wait for the stamp."""
    ctx = _tracing_context()
    if ctx is None:
        return None
    tf, graph, strategy = ctx
    grads = [g for g, _ in grads_and_vars if g is not None]
    if not grads or not all(isinstance(g, (tf.Tensor, tf.IndexedSlices)) for g in grads):
        return None  # nothing to reduce (the original raises its own error) or a type we do not know
    with tf.control_dependencies([_dense(g, tf) for g in grads]), tf.device("/cpu:0"):
        t_enter = tf.timestamp(name="tfcluster_t_enter")
    _independent(t_enter)
    if _bytes_per_pack(strategy) > 0:
        # The strategy reduces gradients in packs as they become ready (overlapping the backward
        # pass): do not hold them back; t_enter is then "the last gradient is ready".
        new = grads_and_vars
    else:
        new = []
        with tf.control_dependencies([t_enter]):
            for g, v in grads_and_vars:
                if isinstance(g, tf.IndexedSlices):
                    g = tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                elif g is not None:
                    g = tf.identity(g)
                new.append((g, v))
    with _stash_lock:
        entry = _stash.get(_key(graph))
        call = 0
        t_data = None
        if entry is not None:
            call = entry["calls"]
            entry["calls"] += 1
            t_data = entry["t_data"]
    return new, _Pending(tf, t_data, t_enter, _replica_id(tf), call)


def _after(p: _Pending, reduced: Any) -> None:
    """Stamp t_exit after the reduced gradients and deliver the three stamps (created after the
    all-reduce in program order, exempt from the stateful-op chain: nothing waits for them but the
    end of the function)."""
    tf = p.tf
    outs = [_dense(g, tf) for g, _ in reduced if g is not None]
    with tf.control_dependencies(outs), tf.device("/cpu:0"):
        t_exit = tf.timestamp(name="tfcluster_t_exit")
    _independent(t_exit)
    how = delivery()
    ring = _ring(tf, p.replica) if how == "ring" else None
    with tf.device("/cpu:0"):  # host ops on host values: no copies through an accelerator
        t_data = p.t_data if p.t_data is not None else tf.constant(_MISSING, tf.float64)
        stamps = tf.stack([t_data, p.t_enter, t_exit], name="tfcluster_stamps")
        if ring is None:
            op = tf.py_function(
                functools.partial(_deliver, p.replica, p.call), [stamps], [], name="tfcluster_step_clock"
            )
            _independent(op)  # with no outputs, py_function returns its Operation
        else:
            ring.write(tf, p.call, stamps)  # resource ops on our own variables: ordered among themselves


def wrap_all_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    """The stamping wrapper of ``all_reduce_sum_gradients`` (the original is called exactly once)."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def all_reduce_sum_gradients(grads_and_vars: Any) -> Any:
        grads_and_vars = list(grads_and_vars)  # the original does the same; lets us read it twice
        try:
            prepared = _before(grads_and_vars)
        except Exception as exc:
            warn_once(
                "stepclock-before", f"step clock: stamping before the all-reduce failed ({exc!r}); step unchanged"
            )
            prepared = None
        if prepared is None:
            return original(grads_and_vars)
        new, pending = prepared
        reduced = original(new)
        try:
            _after(pending, reduced)
        except Exception as exc:
            warn_once("stepclock-after", f"step clock: stamping after the all-reduce failed ({exc!r}); step unchanged")
        return reduced

    setattr(all_reduce_sum_gradients, _WRAPPED, True)
    all_reduce_sum_gradients.__wrapped_original__ = original  # type: ignore[attr-defined]
    return all_reduce_sum_gradients


def patch_optimizer_utils(module: Any) -> bool:
    """Post-import hook for ``tf_keras.src.optimizers.utils`` (and Keras 2's): wrap the all-reduce."""
    original = getattr(module, "all_reduce_sum_gradients", None)
    if original is None or getattr(original, _WRAPPED, False):
        return False
    module.all_reduce_sum_gradients = wrap_all_reduce(original)
    return True


def adopt_optimizer(optimizer: Any) -> bool:
    """A legacy optimizer built before the patch holds the original aggregator: give it ours."""
    agg = getattr(optimizer, "gradient_aggregator", None)
    if agg is None or getattr(agg, _WRAPPED, False):
        return False
    module = getattr(agg, "__module__", "") or ""
    if agg.__name__ != "all_reduce_sum_gradients" or not module.endswith("optimizers.utils"):
        return False  # the user's own aggregator: leave it alone
    optimizer.gradient_aggregator = wrap_all_reduce(agg)
    return True


def wrap_train_step(model: Any) -> Callable[[], None] | None:
    """Wrap the *instance's* ``train_step`` (user overrides included) to stamp t_data; returns undo.

    Set with ``object.__setattr__`` (no Keras attribute tracking) for the duration of one ``fit``; the
    train function traced meanwhile keeps the stamp."""
    original = getattr(model, "train_step", None)
    if original is None or getattr(original, _WRAPPED, False):
        return None
    had_own = "train_step" in getattr(model, "__dict__", {})
    previous = model.__dict__.get("train_step") if had_own else None

    @functools.wraps(original)
    def train_step(data: Any) -> Any:
        try:
            key = _begin_step(data)
        except Exception as exc:
            warn_once("stepclock-data", f"step clock: stamping the batch failed ({exc!r}); step unchanged")
            key = None
        try:
            return original(data)
        finally:
            _end_step(key)

    setattr(train_step, _WRAPPED, True)
    object.__setattr__(model, "train_step", train_step)

    def undo() -> None:
        if model.__dict__.get("train_step") is train_step:
            if had_own:
                object.__setattr__(model, "train_step", previous)
            else:
                object.__delattr__(model, "train_step")

    return undo


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
