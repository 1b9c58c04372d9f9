"""The step clock's graph side: timestamps inside the train step, around the gradient all-reduce.

See ``stepclock.py`` for what the stamps mean and how they are paired with steps. This module patches
the all-reduce and the train step, adds the stamps while a ``tf.function`` is traced, and delivers them
(a ring of local variables, or one ``py_function`` per step). It imports TensorFlow only inside
functions.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import progress
from .progress import warn_once
from .protocol.env import OFF_VALUES, Env

ENV_MODE = Env.STEPCLOCK  # auto (default) | 1 (any strategy) | 0 (off)
ENV_PROFILER = Env.PROFILER  # 1: the TF-profiler sampler instead (crash-prone, see profiling.py)
ENV_DELIVERY = Env.STEPCLOCK_DELIVERY  # ring (default) | pyfunc
RING_SIZE = 4096  # stamps kept per replica until the callback reads them (older ones are overwritten)
MAX_PENDING = 4096  # py_function delivery: stamps waiting for the callback (bounded)
_OFF = OFF_VALUES
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
