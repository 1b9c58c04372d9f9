"""The step clock's collective stamps: ``t_enter`` / ``t_exit`` around every MWMS all-reduce.

Every MWMS all-reduce — Keras ``fit`` (tf_keras or Keras 3), custom loops, ``strategy.reduce``, any
optimizer, gradient accumulation — goes through ``CollectiveAllReduce._all_reduce`` of
``tensorflow.python.distribute.cross_device_ops`` (from a replica context directly, from
``merge_call``/``strategy.reduce`` through ``batch_reduce_implementation``). While a ``tf.function`` is
traced we wrap it there:

- ``t_enter``: when every input of the collective is computed (``devsync.ready``: on a GPU through a
  one-element device-to-host copy, so it is completion, not launch); the collective ops get a control
  edge from the stamp, so they cannot start before it (unless the strategy packs gradients by size,
  ``bytes_per_pack > 0``, which overlaps them with the backward pass);
- ``t_exit``: when every output is computed; inside a replica function the ops consuming the outputs
  (the optimizer update) get a control edge from it.

Each collective is numbered in trace order within its function (``call``) and classified: does it
reduce gradients (``_looks_like_gradients``) and how many elements. The function's largest gradient
all-reduces end its steps (``stampring.primary_calls``). Eager ``next()`` on a distributed iterator is
timed on the host (input fetched outside the ``tf.function``). Failures: one ``tfcluster:`` warning,
the all-reduce is called exactly once with the caller's values.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..progress import warn_once
from . import devsync, gradnorms
from . import reader as stampreader
from . import ring as stampring
from .ring import COLLECTIVE, IN_RUN
from .stamps import _WRAPPED, _active, _dense, _outermost, _patch, _Run, _run_of, _stamp, mode

_GRADIENT_SCOPES = ("gradient_tape/", "gradients/")
_PASS_THROUGH = {"Identity", "Cast", "RealDiv", "Div", "Mul", "Neg", "AddN", "AddV2", "Add", "Reshape"}


_CALLS = {"If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall", "StatefulPartitionedCall"}


@dataclass
class _Pending:
    tf: Any
    graph: Any
    fn: int
    call: int
    replica: int
    device: str | None
    t_enter: Any
    run: _Run | None
    mark: int | None
    pairs: list[tuple[Any, Any, Any]] | None = None  # a gradient all-reduce's packs (device, in, out): gradnorms
    group: int = 1  # the replicas the all-reduce sums
    loss: bool = False  # the scalar the step function returns (strategy.reduce of the loss)


def _looks_like_gradients(tf: Any, tensors: list[Any], replica_context: bool, depth: int = 8) -> bool:
    """Inputs computed by a backward pass (an op under a ``gradient_tape/`` or ``gradients/`` scope
    within a few ops), or — in a replica context — values read from variables through a few
    pass-through ops (accumulated gradients applied every k-th step)."""
    seen: set[str] = set()
    frontier = [t.op for t in tensors]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.name.startswith("gradients") or any(s in op.name for s in _GRADIENT_SCOPES):
                return True
            if len(seen) > 256:
                return False
            nxt.extend(i.op for i in op.inputs)
        frontier = nxt
    if not replica_context:
        return False
    frontier = [t.op for t in tensors]
    for _ in range(4):
        if any(op.type == "ReadVariableOp" for op in frontier):
            return True
        frontier = [i.op for op in frontier if op.type in _PASS_THROUGH for i in op.inputs]
    return False


def _elements(tensors: list[Any]) -> int:
    total = 0
    for t in tensors:
        n = t.shape.num_elements() if t.shape.rank is not None else None
        total += int(n or 0)
    return total


def _wire(tf: Any, flat: list[Any], cdo: Any, options: Any) -> stampring.Wire:
    """What this all-reduce puts on the wire, as the strategy sees it: the dense tensors' bytes
    (elements x dtype size; ``IndexedSlices`` are all-gathered, counted apart), the packs
    ``cross_device_utils.group_by_size`` makes of them (``bytes_per_pack``; 0: one pack), and the
    implementation asked for (the strategy's options merged with the call's, as the launcher does)."""
    dense = [v for v in flat if isinstance(v, tf.Tensor)]
    sizes = []
    for t in dense:
        n = t.shape.num_elements() if t.shape.rank is not None else None
        sizes.append(None if n is None else int(n) * t.dtype.size)
    base = getattr(cdo, "_options", None)
    try:
        merged = base.merge(options) if base is not None and options is not None else (options or base)
    except Exception:
        merged = options or base
    # _all_reduce packs by the options it is given (the strategy's are merged in only later, by the
    # launcher: they decide the implementation, not the packs)
    pack = int(getattr(options, "bytes_per_pack", 0) or 0)
    impl = str(getattr(getattr(merged, "implementation", None), "value", None) or "auto").lower()
    devices = [str(d).upper() for d in (getattr(cdo, "_devices", ()) or ())]
    if impl == "auto" and devices and all("CPU" in d.rpartition("/")[2] for d in devices):
        impl = "ring"  # what AUTO resolves to on CPUs (NCCL needs GPUs); on GPUs TF's runtime decides
    packs = 1
    if pack > 0 and sizes and None not in sizes:
        packs, last = 0, None
        for size in reversed(sizes):  # the order _all_reduce packs them in (reversed gradients)
            if last is None or last > pack:
                packs, last = packs + 1, 0
            last += size
    return stampring.Wire(
        nbytes=sum(s or 0 for s in sizes),
        tensors=len(dense),
        sparse=sum(1 for v in flat if isinstance(v, tf.IndexedSlices)),
        packs=packs if dense else 0,
        bytes_per_pack=pack,
        implementation=impl,
    )


def _enter(cdo: Any, value: Any, replica_id: int, options: Any) -> tuple[Any, _Pending] | None:
    devices = list(getattr(cdo, "_devices", ()) or ())
    group = int(getattr(cdo, "_group_size", 1) or 1)
    act = _active(group > max(1, len(devices)))
    if act is None:
        return None
    tf, graph = act
    flat = tf.nest.flatten(value)
    if not flat or not all(isinstance(v, (tf.Tensor, tf.IndexedSlices)) for v in flat):
        return None  # a type we do not know: leave it to the original
    dense = _dense(tf, flat)
    device = devices[replica_id] if replica_id < len(devices) else None
    fid = stampring.fn_id(_outermost(graph))
    call = stampring.next_call(fid, replica_id)
    run = _run_of(graph, replica_id)  # also set inside merge_call, which runs on behalf of the replicas
    in_replica = run is not None or tf.distribute.get_replica_context() is not None
    gradient = _looks_like_gradients(tf, dense, in_replica)
    optimizer = gradnorms.optimizer_name() if gradient else None
    stampring.note_call(fid, call, gradient, _elements(dense), _wire(tf, flat, cdo, options), group, optimizer)
    t_enter = _stamp(tf, "tfcluster_t_enter", devsync.ready(tf, dense, device))
    loss = not gradient and run is None and gradnorms.is_loss(tf, flat) and stampring.claim_loss_call(fid, call)
    pack = int(
        getattr(options, "bytes_per_pack", 0) or getattr(getattr(cdo, "_options", None), "bytes_per_pack", 0) or 0
    )
    # With packs by size the gradients are reduced as they become ready (overlapping the backward
    # pass): the collectives must not wait for the stamp. Otherwise they do (see wrap_all_reduce).
    mark = None if pack > 0 else len(graph.get_operations())
    stampreader.ensure_started()
    # the noise scale's two terms: each pack in and out of the collective, their norms on sampled steps (gradnorms)
    pairs = gradnorms.begin() if gradient and gradnorms.enabled() else None
    return value, _Pending(tf, graph, fid, call, replica_id, device, t_enter, run, mark, pairs, group, loss)


def _gate(p: _Pending) -> None:
    """Make the collective ops just created wait for ``t_enter`` (a control edge, no extra op), so it is
    taken before the all-reduce starts."""
    if p.mark is None:
        return
    for op in p.graph.get_operations()[p.mark :]:
        if (op.type.startswith("Collective") or op.type in _CALLS) and "tfcluster_" not in op.name:
            op._add_control_input(p.t_enter.op)


def _exit(p: _Pending, result: Any) -> None:
    tf = p.tf
    _gate(p)
    outs = _dense(tf, tf.nest.flatten(result))
    t_exit = _stamp(tf, "tfcluster_t_exit", devsync.ready(tf, outs, p.device))
    norms = gradnorms.norms(tf, p.pairs, p.group, (p.fn, p.call, p.replica)) if p.pairs is not None else None
    run = p.run
    if run is not None and run.graph is p.graph and len(run.inline) < stampring.INLINE:
        run.inline.append((p.call, p.t_enter, t_exit))  # written with the run's row
        if norms is not None:
            run.norms.append(norms)
    else:
        code = COLLECTIVE if run is None else IN_RUN
        values = [p.t_enter, t_exit] + ([gradnorms.loss_value(tf, result)] if p.loss else [])
        stampring.ring(tf, p.replica).write(tf, code, p.fn, p.call, values, norms=norms)
    if run is not None:
        run.exits.append(t_exit)
        run.reduced = outs[-1:] or run.reduced
        if run.graph is p.graph:
            run.results.append((t_exit, outs))


def wrap_all_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``CollectiveAllReduce._all_reduce(self, reduce_op, value, replica_id, options)`` (the
    original is called exactly once)."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def _all_reduce(self: Any, reduce_op: Any, value: Any, replica_id: Any, options: Any) -> Any:
        try:
            prepared = _enter(self, value, replica_id, options)
        except Exception as exc:
            warn_once(
                "stepclock-before", f"step clock: stamping before the all-reduce failed ({exc!r}); step unchanged"
            )
            prepared = None
        try:
            if prepared is None:
                return original(self, reduce_op, value, replica_id, options)
            new, pending = prepared
            result = original(self, reduce_op, new, replica_id, options)
        finally:
            gradnorms.end()
        try:
            _exit(pending, result)
        except Exception as exc:
            warn_once("stepclock-after", f"step clock: stamping after the all-reduce failed ({exc!r}); step unchanged")
        return result

    setattr(_all_reduce, _WRAPPED, True)
    _all_reduce.__wrapped_original__ = original  # type: ignore[attr-defined]
    return _all_reduce


def _note_solo(cdo: Any, pairs: Any, options: Any) -> None:
    """One replica in all: TF returns a ``batch_reduce``'s values unreduced (no collective, nothing to
    stamp). Gradients reduced that way still tell what a step would all-reduce with more workers, and
    that each run of the function is a step (``stampring.note_solo``)."""
    if getattr(cdo, "_num_between_graph_workers", 0) != 1 or len(getattr(cdo, "_devices", ()) or ()) != 1:
        return
    act = _active(False)
    if act is None:
        return
    tf, graph = act
    flat = []
    for value, _ in pairs:
        parts = getattr(value, "values", None)
        flat.extend(tf.nest.flatten(parts[0] if isinstance(parts, tuple) and len(parts) == 1 else value))
    if not flat or not all(isinstance(v, (tf.Tensor, tf.IndexedSlices)) for v in flat):
        return
    if _looks_like_gradients(tf, _dense(tf, flat), False):
        stampring.note_solo(stampring.fn_id(_outermost(graph)), _wire(tf, flat, cdo, options))


def wrap_batch_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``CollectiveAllReduce.batch_reduce(self, reduce_op, value_destination_pairs, options)``
    (the original is called exactly once, with the caller's values)."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def batch_reduce(self: Any, reduce_op: Any, value_destination_pairs: Any, options: Any = None) -> Any:
        try:
            _note_solo(self, value_destination_pairs, options)
        except Exception as exc:
            warn_once("stepclock-solo", f"step clock: reading a one-replica reduction failed ({exc!r}); step unchanged")
        return original(self, reduce_op, value_destination_pairs, options)

    setattr(batch_reduce, _WRAPPED, True)
    batch_reduce.__wrapped_original__ = original  # type: ignore[attr-defined]
    return batch_reduce


def wrap_get_next(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``DistributedIteratorBase.get_next``: an eager ``next()`` (input fetched outside the
    ``tf.function``) is timed on the host and counted as input time by the reader."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def get_next(self: Any, *args: Any, **kwargs: Any) -> Any:
        eager = _executing_eagerly()
        t0 = time.time() if eager else 0.0
        try:
            return original(self, *args, **kwargs)
        finally:
            if eager:
                stampring.note_input(t0, time.time())

    setattr(get_next, _WRAPPED, True)
    return get_next


def _executing_eagerly() -> bool:
    try:
        if mode() == "off":
            return False
        from tensorflow.python.eager import context

        return bool(context.executing_eagerly())
    except Exception:
        return False


def patch_cross_device_ops(module: Any) -> bool:
    """Post-import hook for ``tensorflow.python.distribute.cross_device_ops``."""
    reduce_ok = _patch(module.CollectiveAllReduce, "_all_reduce", wrap_all_reduce)
    if getattr(module, "cross_device_utils", None) is not None:
        gradnorms.patch_launcher(module.cross_device_utils)  # where each pack is one flat tensor
    return _patch(module.CollectiveAllReduce, "batch_reduce", wrap_batch_reduce) or reduce_ok


def patch_input_lib(module: Any) -> bool:
    """Post-import hook for ``tensorflow.python.distribute.input_lib``."""
    return _patch(module.DistributedIteratorBase, "get_next", wrap_get_next)
