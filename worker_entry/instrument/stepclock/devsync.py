"""GPU-correct stamps: what a host timestamp must depend on to be taken when device work is *done*.

On a GPU, TensorFlow runs kernels asynchronously: an op on a GPU stream counts as done for the
executor once its kernel is *enqueued*, so a host ``Timestamp`` that depends on a GPU tensor only by a
control edge fires when the kernel is launched, not when it finishes. A device-to-host copy is
different: TensorFlow's GPU device enqueues it on its device-to-host stream behind a wait for the
compute stream, and the host-side consumer runs only when the copy has completed. So a stamp that
depends on the host copy of a one-element slice of a device tensor, created after every op it must
follow, is taken after the GPU has executed all of them (everything enqueued on the compute stream
before the copy, which TensorFlow uses as one in-order stream per GPU).

Cost per synced stamp: one 1-element slice kernel and a 4-8 byte copy (a few µs of GPU time, ~10-20 µs
of latency on the host side that overlaps other work unless something waits for the stamp).

``TFCLUSTER_STAMP_SYNC``: ``auto`` (default: sync stamps of tensors on GPU/TPU devices), ``1`` (always,
also on CPU: tests, cost measurement), ``0`` (never: launch-time stamps).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...protocol.env import OFF_VALUES, Env

_ON = ("1", "true", "yes", "on", "force")
_ACCELERATORS = ("GPU", "TPU")


def sync_mode(env: Mapping[str, str] = os.environ) -> str:
    """``auto``, ``force`` or ``off`` from ``TFCLUSTER_STAMP_SYNC``."""
    raw = (env.get(Env.STAMP_SYNC) or "auto").strip().lower()
    if raw in OFF_VALUES:
        return "off"
    return "force" if raw in _ON else "auto"


def needs_sync(device: str | None, mode: str | None = None) -> bool:
    """Whether stamps of tensors on ``device`` must wait for completion (not just the launch)."""
    mode = mode or sync_mode()
    if mode == "off":
        return False
    if mode == "force":
        return True
    name = (device or "").upper()
    return any(f"{kind}:" in name for kind in _ACCELERATORS)


def _numeric(tf: Any, t: Any) -> bool:
    dtype = getattr(t, "dtype", None)
    return dtype is not None and (dtype.is_floating or dtype.is_integer or dtype.is_bool or dtype.is_complex)


def _source(tf: Any, tensors: Sequence[Any]) -> Any | None:
    """A device tensor to slice: the last numeric one with a known, non-zero size (else any numeric)."""
    numeric = [t for t in tensors if _numeric(tf, t)]
    for t in reversed(numeric):
        n = t.shape.num_elements() if t.shape.rank is not None else None
        if n:
            return t
    return numeric[-1] if numeric else None


def ready(
    tf: Any, tensors: Sequence[Any], device: str | None, after: Iterable[Any] = (), mode: str | None = None
) -> list[Any]:
    """The control inputs for a host stamp taken when ``tensors`` are computed and the ops ``after``
    have run. On CPU (or with sync off): those tensors and ops themselves. On an accelerator: one host
    tensor, the copy of a one-element slice of a device tensor created after all of them."""
    deps = [*tensors, *after]
    if not deps or not needs_sync(device or _device_of(tensors), mode):
        return deps
    src = _source(tf, tensors)
    if src is None:
        return deps  # nothing on the device to copy: launch-time stamp
    with tf.name_scope("tfcluster_sync"):
        with tf.control_dependencies(deps), tf.device(src.device or device or None):
            tiny = tf.reshape(src, [-1])[:1]
        with tf.device("/cpu:0"):
            host = tf.identity(tiny, name="tfcluster_d2h")
    return [host]


def _device_of(tensors: Sequence[Any]) -> str:
    for t in tensors:
        d = getattr(t, "device", "") or ""
        if d:
            return d
    return ""
