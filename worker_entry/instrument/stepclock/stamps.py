"""The step clock's graph side: stamps around each replica function of ``strategy.run``, and the
shared machinery of the stamps (configuration, where they may be added, how they are made).

Around each replica's function of ``strategy.run`` (``_call_for_each_replica``, which MWMS inherits
from ``MirroredExtended``; the same for Keras's train function and custom loops) while a
``tf.function`` is traced:

- ``t_start``: a stamp with no inputs, taken before the ops that fetch the batch (``IteratorGetNext``
  and kin get a control edge from it): when the function (or loop iteration) begins executing;
- ``t_data``: when every input tensor of the replica function is available (the batch); the
  function's first ops get a control edge from it, so the forward pass starts after it;
- ``t_done``: after the replica function's outputs, the exits of its collectives and every stateful
  op it created (optimizer and metric updates): the end of its work after the all-reduce.

The collectives themselves are stamped by ``collectives.py``. Each replica function writes one row
into its replica's ring (``stampring``), carrying its collectives; the reader thread
(``stampreader``) turns rows into steps: one step = the span between consecutive *primary*
collectives (the function's largest all-reduces whose inputs look like gradients) — no framework
callback needed. Our control edges only order our stamps; no op is added in front of the user's.

Stamps are added only while tracing a ``tf.function`` (not XLA-compiled), in TF2 mode, under a
multi-worker MWMS (``TFCLUSTER_STEPCLOCK=1``: any collective strategy; ``0``: never), with progress
records on (or forced). Any failure prints one ``tfcluster:`` warning and the step is built exactly as
without us: the replica function is called once with its own arguments.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...protocol.env import OFF_VALUES, Env
from .. import progress
from ..progress import warn_once
from . import devsync, gradnorms
from . import reader as stampreader
from . import ring as stampring
from .ring import RUN

_ON = ("1", "true", "yes", "on", "force")
_WRAPPED = "_tfcluster_stepclock"


# ------------------------------------------------------------------------------------ configuration


def mode(env: Mapping[str, str] = os.environ) -> str:
    """``off``, ``auto`` (multi-worker MWMS, progress records on) or ``force`` (any collective strategy)."""
    raw = (env.get(Env.STEPCLOCK) or "auto").strip().lower()
    if raw in OFF_VALUES or (env.get(Env.PROFILER) or "").strip().lower() in _ON:
        return "off"  # TFCLUSTER_PROFILER=1: the TF-profiler sampler instead (profiling.py)
    return "force" if raw in _ON else "auto"


def _active(multi_worker: bool) -> tuple[Any, Any] | None:
    """(tf, graph) when stamps belong in the function being traced now, else None."""
    m = mode()
    if m == "off" or (m == "auto" and (not multi_worker or not progress.get_writer().enabled)):
        return None
    import tensorflow as tf
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    if not tf.inside_function() or not ops.executing_eagerly_outside_functions():
        return None  # eager steps have no graph to stamp; TF1 graph mode is not supported
    graph = ops.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        return None  # jit_compile: XLA cannot compile Timestamp
    return tf, graph


def _outermost(graph: Any) -> Any:
    while getattr(graph, "outer_graph", None) is not None and hasattr(graph.outer_graph, "outer_graph"):
        graph = graph.outer_graph
    return graph


def _independent(*tensors_or_ops: Any) -> None:
    """Exempt our stamps from the automatic control dependencies' program-order chain of stateful ops
    without resource inputs: chained, a stamp would wait for every stamp created before it (with two
    replicas per worker, replica 1's t_data for replica 0's t_enter)."""
    from tensorflow.python.framework import ops

    manager = getattr(ops.get_default_graph(), "experimental_acd_manager", None)
    run_independently = getattr(manager, "run_independently", None)
    if run_independently is None:
        return
    for x in tensors_or_ops:
        op = x if isinstance(x, ops.Operation) else getattr(x, "op", None)
        if op is not None:
            run_independently(op)


def _stamp(tf: Any, name: str, deps: list[Any]) -> Any:
    with tf.control_dependencies(deps), tf.device("/cpu:0"):
        t = tf.timestamp(name=name)
    _independent(t)
    return t


def _dense(tf: Any, values: list[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, tf.IndexedSlices):
            out.append(v.values)
        elif isinstance(v, tf.Tensor):
            out.append(v)
    return out


# ------------------------------------------------------------------ the replica function's stamps


@dataclass
class _Run:
    tf: Any
    graph: Any
    fn: int
    replica: int
    device: str | None
    mark: int
    t_start: Any
    t_data: Any
    batches: list[Any]  # one input with a batch dimension per batch it consumes (``_batch_inputs``)
    per_replica: float  # examples per replica function = its batches x this factor (replicas in sync / local)
    inputs: list[Any] = field(default_factory=list)
    inline: list[tuple[int, Any, Any]] = field(default_factory=list)  # (call, t_enter, t_exit)
    results: list[tuple[Any, list[Any]]] = field(default_factory=list)  # (t_exit, the collective's outputs)
    exits: list[Any] = field(default_factory=list)
    reduced: list[Any] = field(default_factory=list)
    norms: list[tuple[Any, Any]] = field(default_factory=list)  # its inline gradient all-reduces' (local, total)


_runs: dict[tuple[int, int], _Run] = {}  # (id(graph of the replica function), local replica) -> run
_runs_lock = threading.Lock()


def _local_replica(tf: Any) -> int:
    ctx = tf.distribute.get_replica_context()
    rid = getattr(ctx, "_replica_id", 0)
    return rid if isinstance(rid, int) else 0


_INPUT_OPS = {
    "IteratorGetNext",
    "IteratorGetNextSync",
    "IteratorGetNextAsOptional",
    "OptionalGetValue",
    "MultiDeviceIteratorGetNextFromShard",
}


def _input_ops(tensors: list[Any], graph: Any, depth: int = 12) -> list[Any]:
    """The ops of ``graph`` that fetch the batch (``IteratorGetNext`` and kin) upstream of ``tensors``."""
    found, seen = [], set()
    frontier = [t.op for t in tensors]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            if op.name in seen or op.graph is not graph or len(seen) > 256:
                continue
            seen.add(op.name)
            if op.type in _INPUT_OPS:
                found.append(op)
                continue
            nxt.extend(i.op for i in op.inputs)
        frontier = nxt
    return found


def _begin_run(extended: Any, args: tuple, kwargs: dict) -> tuple[_Run, tuple, dict] | None:
    """Stamp the start of a replica function and the arrival of its batch (``_end_run`` makes the
    function's first ops wait for that stamp)."""
    act = _active(_multi_worker(extended))
    if act is None:
        return None
    tf, graph = act
    replica = _local_replica(tf)
    devices = list(getattr(extended, "worker_devices", ()) or ())
    device = devices[replica] if replica < len(devices) else None
    fid = stampring.fn_id(_outermost(graph))
    flat = [t for t in tf.nest.flatten((args, kwargs), expand_composites=True) if isinstance(t, tf.Tensor)]
    t_start = _stamp(tf, "tfcluster_t_start", [])
    for op in _input_ops(flat, graph):
        op._add_control_input(t_start.op)  # t_start is taken before the batch is fetched
    t_data = _stamp(tf, "tfcluster_t_data", [*devsync.ready(tf, flat, device), t_start])
    batches = _batch_inputs(tf, args, kwargs, graph)
    factor = _replica_factor(extended)
    run = _Run(tf, graph, fid, replica, device, len(graph.get_operations()), t_start, t_data, batches, factor, flat)
    with _runs_lock:
        _runs[(id(graph), replica)] = run
    return run, args, kwargs


def _batch_inputs(tf: Any, args: tuple, kwargs: dict, graph: Any) -> list[Any]:
    """One input with a batch dimension (rank >= 1: a tensor, or a ragged or sparse tensor as a whole) per
    batch the replica function consumes. Usually one: features and labels of one batch count once. Several
    when it is given several batches at once (gradient accumulation over micro-batches passed together):
    inputs fetched by different dataset ``next()``s in this graph, or else several positional arguments of
    the same nested structure (``strategy.run(fn, args=(b1, b2, b3, b4))``, each ``(x, y)``)."""
    composites = (tf.RaggedTensor, tf.SparseTensor)

    def batchlike(x: Any) -> bool:
        return isinstance(x, (tf.Tensor, *composites)) and bool(x.shape.rank)

    found = [x for x in tf.nest.flatten((args, kwargs)) if batchlike(x)]
    if len(found) < 2:
        return found
    fetched: dict[str, Any] = {}
    for x in found:
        parts = [t for t in tf.nest.flatten(x, expand_composites=True) if isinstance(t, tf.Tensor)]
        ops = {op.name for op in _input_ops(parts, graph)}
        if len(ops) != 1:
            fetched = {}
            break
        fetched.setdefault(ops.pop(), x)  # the first input of each next(): its batch
    if len(fetched) > 1:
        return list(fetched.values())
    if len(args) > 1 and all(tf.nest.is_nested(a) and len(tf.nest.flatten(a)) > 1 for a in args):
        try:
            for a in args[1:]:
                tf.nest.assert_same_structure(args[0], a)
        except (ValueError, TypeError):
            return found[:1]
        per_arg = [[x for x in tf.nest.flatten(a) if batchlike(x)][:1] for a in args]
        if all(per_arg):
            return [xs[0] for xs in per_arg]
    return found[:1]


def _replica_factor(extended: Any) -> float:
    """Replicas in sync per local replica: one replica's batch times this is the step's examples across
    every worker (each worker's replicas get equal shares of the global batch)."""
    replicas = int(getattr(extended._container_strategy(), "num_replicas_in_sync", 1) or 1)
    local = len(getattr(extended, "worker_devices", ()) or ()) or 1
    return replicas / local


def _examples(tf: Any, run: _Run) -> Any:
    """The examples of one execution of the replica function across the replicas in sync: its batch
    times ``per_replica`` — a number when the batch dimension is static, else a float64 scalar measured
    in the graph. Its batch dimension is metadata of the input (``Shape``, placed with the input, so a
    GPU tensor is not copied and nothing waits for a kernel): no sync point is added to the step, and
    the row that carries it is written at ``t_done`` as before."""
    static = 0.0
    measured: list[Any] = []
    for x in run.batches:
        if x.shape[0] is not None:
            static += float(int(x.shape[0]) * run.per_replica)
        else:
            measured.append(_rows(tf, x))
    if not measured:
        return static
    with tf.device("/cpu:0"):
        return tf.add_n([tf.cast(r, tf.float64) for r in measured]) * run.per_replica + static


def _rows(tf: Any, x: Any) -> Any:
    """The batch dimension of ``x`` measured in the graph, read where ``x`` is (its ``Shape``: metadata)."""
    from tensorflow.python.framework import ops

    with tf.name_scope("tfcluster_batch"):
        if isinstance(x, tf.RaggedTensor):
            with ops.colocate_with(x.row_splits):
                return tf.shape(x.row_splits, out_type=tf.int64)[0] - 1
        if isinstance(x, tf.SparseTensor):
            with ops.colocate_with(x.dense_shape):
                return x.dense_shape[0]
        with ops.colocate_with(x):
            return tf.shape(x, out_type=tf.int64)[0]


def _end_run(run: _Run, outputs: Any) -> None:
    """After the replica function was traced: its first ops wait for ``t_data`` (the forward pass
    cannot start before the batch stamp), ``t_done`` follows all its work, and one row carries the
    run's stamps with up to ``INLINE`` of its collectives."""
    tf, graph = run.tf, run.graph
    created = graph.get_operations()[run.mark :]
    mine = set(created)

    def wait_for(stamp: Any, tensors: list[Any]) -> None:
        for t in tensors:
            for op in t.consumers():
                if op in mine and "tfcluster_" not in op.name:
                    op._add_control_input(stamp.op)

    wait_for(run.t_data, run.inputs)  # the forward pass starts after the batch stamp
    for t_exit, outs in run.results:
        wait_for(t_exit, outs)  # the update starts after the all-reduce's exit stamp
    flat = [t for t in tf.nest.flatten(outputs, expand_composites=True) if isinstance(t, tf.Tensor)]
    after = [
        op
        for op in created
        if op._is_stateful and "tfcluster_" not in op.name and getattr(op, "_control_flow_context", None) is None
    ]
    # t_done follows the last collective's exit, the outputs and every stateful op of the function
    # (optimizer and metric updates); on a GPU it waits for them through a copy of a reduced value.
    t_done = _stamp(tf, "tfcluster_t_done", devsync.ready(tf, flat + run.reduced[-1:], run.device, after + run.exits))
    values = [run.t_start, run.t_data, t_done]
    for call, t_enter, t_exit in run.inline:
        values += [float(call), t_enter, t_exit]
    examples = _examples(tf, run)  # after the edges above: nothing of ours waits for it but the row
    norms = gradnorms.add(tf, run.norms)  # the noise scale's two terms of its inline gradient all-reduces
    stampring.ring(tf, run.replica).write(tf, RUN, run.fn, len(run.inline), values, examples, norms)
    stampring.note_run(run.fn)  # its steps close when this row arrives
    stampreader.ensure_started()


def _finish_run(run: _Run | None) -> None:
    if run is not None:
        with _runs_lock:
            if _runs.get((id(run.graph), run.replica)) is run:
                del _runs[(id(run.graph), run.replica)]


def _run_of(graph: Any, replica: int) -> _Run | None:
    """The replica function being traced whose graph is ``graph`` or encloses it (cond/while bodies)."""
    with _runs_lock:
        while graph is not None:
            run = _runs.get((id(graph), replica))
            if run is not None:
                return run
            graph = getattr(graph, "outer_graph", None)
    return None


def _multi_worker(extended: Any) -> bool:
    check = getattr(extended, "_in_multi_worker_mode", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:
        return False


def wrap_call_for_each_replica(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``MirroredExtended._call_for_each_replica``: each replica's function is traced between our
    t_start/t_data and t_done stamps."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def _call_for_each_replica(self: Any, fn: Any, args: Any, kwargs: Any) -> Any:
        replica_fn = fn
        try:
            if not hasattr(fn, "python_function") and mode() != "off":  # a tf.function keeps its own path
                replica_fn = _replica_wrapper(self, fn)
        except Exception as exc:
            warn_once("stepclock-run", f"step clock: wrapping the replica function failed ({exc!r}); step unchanged")
        return original(self, replica_fn, args, kwargs)

    setattr(_call_for_each_replica, _WRAPPED, True)
    _call_for_each_replica.__wrapped_original__ = original  # type: ignore[attr-defined]
    return _call_for_each_replica


def _replica_wrapper(extended: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    from tensorflow.python.autograph.impl import api as autograph_api

    def replica_fn(*args: Any, **kwargs: Any) -> Any:
        run = None
        try:
            begun = _begin_run(extended, args, kwargs)
            if begun is not None:
                run, args, kwargs = begun
        except Exception as exc:
            warn_once("stepclock-begin", f"step clock: stamping the batch failed ({exc!r}); step unchanged")
        try:
            out = fn(*args, **kwargs)
            if run is not None:
                try:
                    _end_run(run, out)
                except Exception as exc:
                    warn_once("stepclock-end", f"step clock: stamping the step's end failed ({exc!r}); step unchanged")
            return out
        finally:
            _finish_run(run)

    # AutoGraph converted ``fn`` already (strategy.run); it must not convert our wrapper's own code.
    return autograph_api.autograph_artifact(functools.wraps(fn)(replica_fn))


def _patch(cls: Any, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    original = getattr(cls, name, None)
    if original is None or getattr(original, _WRAPPED, False):
        return False
    setattr(cls, name, wrapper(original))
    return True


def patch_extended(module: Any) -> bool:
    """Post-import hook for ``tensorflow.python.distribute.mirrored_strategy``: MWMS's extended class
    inherits ``_call_for_each_replica`` from ``MirroredExtended`` (the wrapper stamps only under a
    multi-worker strategy, or when forced)."""
    return _patch(module.MirroredExtended, "_call_for_each_replica", wrap_call_for_each_replica)
