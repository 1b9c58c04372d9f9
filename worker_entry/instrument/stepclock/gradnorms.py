"""The gradient noise scale's two measurements per step, taken where the step clock already stands:
the squared norm of each replica's gradient before the all-reduce and of the reduced gradient after it.

Two batch sizes per step, b (one replica) and N·b (all of them), and E|g_B|² = |G|² + tr(Σ)/B
(McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", appendix A) give |G|² and tr(Σ)
with no extra communication: each worker reports its own replicas' |g_i|² and the reduced |R/d|²
(d = the group for a SUM: R/d is then the mean of the replicas' gradients, on the same scale as each
g_i however the loss was scaled); the launcher averages the workers (``orchestrator/views/noise_scale``).

Dense gradients only (an ``IndexedSlices`` is all-gathered, not summed: left out and counted), cast to
float32 and summed on the replica's device (one scalar per all-reduce reaches the host, with the row
the step clock writes anyway); a non-finite norm (AMP's overflow steps) marks the step to skip. Graph
side only; nothing here changes a value of the user's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from ...protocol.env import OFF_VALUES, Env


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """``TFCLUSTER_GRADNOISE`` (default on): ``0`` leaves the norms out (the overhead benchmarks' baseline)."""
    return (env.get(Env.GRADNOISE) or "1").strip().lower() not in OFF_VALUES


def dense(tf: Any, flat: list[Any]) -> list[Any]:
    """The floating dense tensors of an all-reduce (``IndexedSlices`` left out)."""
    return [v for v in flat if isinstance(v, tf.Tensor) and v.dtype.is_floating]


def squared_norm(tf: Any, tensors: list[Any], device: str | None) -> Any:
    """Σ|t|² of ``tensors`` in float32 on ``device``, as a float64 scalar on the host (None: none)."""
    if not tensors:
        return None
    with tf.name_scope("tfcluster_gns"):
        with tf.device(device) if device else contextlib.nullcontext():
            parts = [tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors]
            total = parts[0] if len(parts) == 1 else tf.add_n(parts)
        with tf.device("/cpu:0"):
            return tf.cast(total, tf.float64)


def divisor(reduce_op: Any, group: int) -> float:
    """d in T = |R/d|²: the group for a SUM (R is then N times the replicas' mean), 1 for a MEAN (TF's
    ``_all_reduce`` divides by the group itself)."""
    name = str(getattr(reduce_op, "value", reduce_op) or "").upper()
    return float(max(1, group)) if name.endswith("SUM") else 1.0


def reduced_sq(tf: Any, tensors: list[Any], device: str | None, d: float) -> Any:
    """|R/d|² of the reduced tensors, as a float64 scalar on the host (divided there: no extra pass)."""
    sq = squared_norm(tf, tensors, device)
    if sq is None:
        return None
    with tf.device("/cpu:0"):
        return sq / (d * d)


def add(tf: Any, pairs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The sums of (local, total) squared norms over a replica function's gradient all-reduces."""
    pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
    if not pairs:
        return None
    with tf.name_scope("tfcluster_gns"), tf.device("/cpu:0"):
        if len(pairs) == 1:
            return pairs[0]
        return tf.add_n([a for a, _ in pairs]), tf.add_n([b for _, b in pairs])


def is_loss(tf: Any, flat: list[Any]) -> bool:
    """One floating scalar tensor reduced outside any replica function (a cross-replica or the default
    context, as ``strategy.reduce`` in a step function is): what ``strategy.reduce(..., loss)`` reduces."""
    ctx = tf.distribute.get_replica_context()
    return (
        not (ctx is not None and tf.distribute.has_strategy())
        and len(flat) == 1
        and isinstance(flat[0], tf.Tensor)
        and flat[0].dtype.is_floating
        and flat[0].shape.rank is not None
        and flat[0].shape.num_elements() == 1
    )


def loss_value(tf: Any, result: Any) -> Any:
    """The reduced loss as a float64 scalar on the host."""
    (value,) = tf.nest.flatten(result)
    with tf.name_scope("tfcluster_loss"), tf.device("/cpu:0"):
        return tf.reshape(tf.cast(value, tf.float64), [])


def optimizer_name(depth: int = 64) -> str | None:
    """The class of the optimizer whose gradients are being reduced: a ``self`` up the Python stack (at
    trace time) that is an optimizer (tf_keras ``apply_gradients`` → ``aggregate_gradients``, Keras 3, the
    legacy ``OptimizerV2``) — this thread's, else a replica thread's: a ``merge_call`` runs its function
    in the strategy's main thread while the replica's thread, whose optimizer asked, waits. None when the
    all-reduce was not called from an optimizer."""
    stacks = [sys._getframe(1)]
    stacks += [f for t, f in sys._current_frames().items() if _replica_thread(t)]
    for frame in stacks:
        for _ in range(depth):
            if frame is None:
                break
            obj = frame.f_locals.get("self")
            if obj is not None and any("Optimizer" in c.__name__ for c in type(obj).__mro__[:-1]):
                inner = getattr(obj, "inner_optimizer", None)  # a LossScaleOptimizer names what it wraps
                return type(inner if inner is not None else obj).__name__
            frame = frame.f_back
    return None


def _replica_thread(ident: int) -> bool:
    """A thread of ``mirrored_run`` running a replica function (``_MirroredReplicaThread``)."""
    thread = threading._active.get(ident)  # type: ignore[attr-defined]
    return thread is not None and "Replica" in type(thread).__name__
