"""The gradient noise scale's two measurements per step, taken where the step clock already stands:
the squared norm of each replica's gradient before the all-reduce and of the reduced gradient after it.

Two batch sizes per step, b (one replica) and N·b (all of them), and E|g_B|² = |G|² + tr(Σ)/B
(McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", appendix A) give |G|² and tr(Σ)
with no extra communication: each worker reports its own replicas' |g_i|² and the reduced |R/d|²
(d = the group: the collective sums, so R/d is the mean of the replicas' gradients, on the same scale as
each g_i however the loss was scaled); the launcher averages the workers (``orchestrator/views/noise_scale``).

Where: ``CollectiveAllReduce._all_reduce`` packs the dense gradients (``group_by_size``), concatenates
each pack into one flat tensor and all-reduces it with ``CollectiveReplicaLauncher.all_reduce``. While a
gradient ``_all_reduce`` is being traced (``begin``), that call is wrapped (``wrap_launcher``): it notes
the flat pack going in and the flat sum coming out, and ``norms`` takes their squared norms — one fused
``l2_loss`` kernel each on the replica's device (float32 accumulation: a 16-bit pack is cast first), two per pack in all, on
tensors the all-reduce builds anyway. Measured with PyTorch on an H200 (bench/gradnorm_gpu.py): per
tensor instead, ResNet-50's 161 gradients cost ~6 ms per step in kernel launches. ``IndexedSlices`` are
all-gathered, not summed: left out (counted by the step clock). A non-finite norm (AMP's overflow steps)
marks the step to skip. The values reach the host as float64 in the row the step clock writes anyway.

Per all-reduce, not per pack (``norms``): the packs' halves are summed where they live, stacked into one
2-vector, moved to the host once, and there cast to float64 and scaled (x2 for ``l2_loss``'s half, 1/d²
for the sum) by one multiply: 2 ops per pack plus 4 per all-reduce (stack, cast, multiply, unstack; 2
``add_n`` more with several packs) and one device-to-host copy — it was 6 ops and 2 copies per pack
plus a division. Nothing is read back per step: the row is the step clock's.

On every k-th step only (``TFCLUSTER_GRADNOISE_EVERY``, default ``DEFAULT_EVERY``; ``_sampled``): the
reductions cost a nearly fixed ~2 x replicas x parameters reads per step — 1.4-3.9 % of a ~9 ms CPU
step of a 50 k-parameter model (docs/benchmarks.md §19) — so they run inside a ``tf.cond`` on a per-replica
host counter of the all-reduce's executions: the other steps' rows carry -1 (no norms), which the
readers skip (never read as 0). Every all-reduce of a step, on every replica and worker, counts its own
executions from the same start, so a step is sampled whole or not at all; the estimator is linear in
the norms, so the sampled steps' means are the same unbiased estimates, from fewer steps (the launcher
widens the standard error and decays its averages by d^k per sample: ``orchestrator/views/noise_scale``).
Graph side only; nothing here changes a value of the user's, and the all-reduce is called exactly once
with the caller's arguments.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...protocol.env import OFF_VALUES, Env
from ...protocol.training import EVERY_MAX
from ..progress import warn_once

_WRAPPED = "_tfcluster_gradnorms"
_local = threading.local()  # .pairs: the (device, in, out) packs of the gradient all-reduce being traced
#: Norms on every k-th step by default: at 8, the +2.9 % that every step cost on a CPU step of a 50 k-parameter
#: model fell to +0.93 %, most of it the counter and the cond themselves (docs/benchmarks.md §19): a larger k
#: would buy little more and cost the estimate samples.
DEFAULT_EVERY = 8
_counters: dict[tuple[int, int, int], Any] = {}  # (fn, call, replica) -> its all-reduce's executions
_counters_lock = threading.Lock()
_traced = [DEFAULT_EVERY]  # the period of the last all-reduce traced with norms (what the rows sample)


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """``TFCLUSTER_GRADNOISE`` (default on): ``0`` leaves the norms out (the overhead benchmarks' baseline)."""
    return (env.get(Env.GRADNOISE) or "1").strip().lower() not in OFF_VALUES


def every(env: Mapping[str, str] = os.environ) -> int:
    """``TFCLUSTER_GRADNOISE_EVERY``: the norms on every k-th step (default ``DEFAULT_EVERY``; 1: every
    step). Read at trace time; a bad value warns once and keeps the default (never raises into training)."""
    raw = (env.get(Env.GRADNOISE_EVERY) or "").strip()
    if not raw:
        return DEFAULT_EVERY
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if not 1 <= k <= EVERY_MAX:
        warn_once(
            "gradnoise-every",
            f"{Env.GRADNOISE_EVERY}={raw!r} is not a whole number of steps from 1 to {EVERY_MAX}; "
            f"using {DEFAULT_EVERY}",
        )
        return DEFAULT_EVERY
    return k


def traced_every() -> int:
    """The sampling period of the norms the graph writes (the last traced all-reduce's): ``GradNoise.every``."""
    return _traced[0]


def begin() -> list[tuple[Any, Any, Any]]:
    """Collect the packs of the gradient all-reduce about to be traced in this thread."""
    pairs: list[tuple[Any, Any, Any]] = []
    _local.pairs = pairs
    return pairs


def end() -> None:
    _local.pairs = None


def squared_norm(tf: Any, x: Any) -> Any:
    """Half |x|² of one tensor with one fused kernel (``l2_loss`` = Σx²/2), accumulated in float32 or
    better, where ``x`` lives; ``norms`` doubles it once per all-reduce, on the host."""
    if x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    return tf.nn.l2_loss(x)


def wrap_launcher(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``CollectiveReplicaLauncher.all_reduce(self, input_tensor, control_input=None, options=None)``:
    inside a gradient ``_all_reduce`` being traced, note the flat pack going in and its sum coming out
    (their norms are taken by ``norms``, on a sampled step only). No op is added here."""
    if getattr(original, _WRAPPED, False):
        return original

    @functools.wraps(original)
    def all_reduce(self: Any, input_tensor: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = getattr(_local, "pairs", None)
        result = original(self, input_tensor, *args, **kwargs)
        try:
            if pairs is not None and input_tensor.dtype.is_floating:
                pairs.append((getattr(self, "_device", None) or "", input_tensor, result))
        except Exception:
            pass
        return result

    setattr(all_reduce, _WRAPPED, True)
    all_reduce.__wrapped_original__ = original  # type: ignore[attr-defined]
    return all_reduce


def patch_launcher(utils_module: Any) -> bool:
    """Wrap ``cross_device_utils.CollectiveReplicaLauncher.all_reduce`` (once)."""
    cls = getattr(utils_module, "CollectiveReplicaLauncher", None)
    original = getattr(cls, "all_reduce", None)
    if original is None or getattr(original, _WRAPPED, False):
        return False
    cls.all_reduce = wrap_launcher(original)
    return True


def norms(tf: Any, pairs: list[tuple[Any, Any, Any]], group: int, key: tuple[int, int, int]) -> tuple[Any, Any] | None:
    """(|g_i|², |R/d|²) of one all-reduce from its packs, as float64 scalars on the host; (-1, -1) on a
    step not sampled (``every``: a ``tf.cond`` on the all-reduce's counter ``key`` = (fn, call, replica)).
    None: no pack."""
    if not pairs:
        return None
    k = every()
    _traced[0] = k
    with tf.name_scope("tfcluster_gns"):
        if k == 1:
            return _norms(tf, pairs, group)
        with tf.device("/cpu:0"):
            sampled = _sampled(tf, key, k)
            none = tf.constant(-1.0, tf.float64)
        # outside the host's device scope: the reductions in the branch stay on the replica's device
        return tuple(tf.cond(sampled, lambda: _norms(tf, pairs, group), lambda: (none, none)))


def _sampled(tf: Any, key: tuple[int, int, int], k: int) -> Any:
    """True on the all-reduce's executions 0, k, 2k, ...: a host counter of its own (created eagerly, never
    a distributed or checkpointed variable), so the all-reduces of one step on every replica agree."""
    from tensorflow.python.ops import resource_variable_ops

    with _counters_lock:
        counter = _counters.get(key)
        if counter is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                counter = resource_variable_ops.ResourceVariable(
                    tf.constant(-1, tf.int64), trainable=False, name=f"tfcluster_gns_count_{key[2]}"
                )
            _counters[key] = counter
    n = counter.assign_add(tf.constant(1, tf.int64), read_value=True)
    return tf.equal(tf.math.floormod(n, k), 0)


def _norms(tf: Any, pairs: list[tuple[Any, Any, Any]], group: int) -> tuple[Any, Any]:
    """The packs' half squared norms where they live (one ``l2_loss`` each, in and out), summed there,
    one 2-vector to the host, doubled, the second divided by the group² (the collective sums; a MEAN
    divides only after it)."""
    device = pairs[0][0]
    with tf.device(device):
        halves = [squared_norm(tf, x) for _, x, _ in pairs] + [squared_norm(tf, y) for _, _, y in pairs]
    if len({h.dtype for h in halves}) > 1:  # a float64 pack beside float32 ones: add in float64
        halves = [tf.cast(h, tf.float64) for h in halves]
    n = len(pairs)
    with tf.device(device):
        local = halves[0] if n == 1 else tf.add_n(halves[:n])
        total = halves[n] if n == 1 else tf.add_n(halves[n:])
        both = tf.stack([local, total])
    with tf.device("/cpu:0"):
        scale = tf.constant([2.0, 2.0 / float(max(1, group)) ** 2], tf.float64)
        local, total = tf.unstack(tf.cast(both, tf.float64) * scale)
    return local, total


def add(tf: Any, pairs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The sums of (local, total) squared norms over a replica function's gradient all-reduces; (-1, -1)
    when one of them was not sampled (a step's norms whole or not at all)."""
    pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
    if not pairs:
        return None
    with tf.name_scope("tfcluster_gns"), tf.device("/cpu:0"):
        if len(pairs) == 1:
            return pairs[0]
        flat = [x for p in pairs for x in p]
        missing = tf.reduce_any(tf.stack(flat) < 0)
        none = tf.constant(-1.0, tf.float64)
        local, total = tf.add_n([a for a, _ in pairs]), tf.add_n([b for _, b in pairs])
        return tf.where(missing, none, local), tf.where(missing, none, total)


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
