"""The per-worker batch a training script should use under `tfcluster scale`, and after a reshape.

A sweep runs the same script at several worker counts. Weak scaling (the default) keeps the
per-worker batch, so the global batch grows with the workers; strong scaling (`scale --strong`)
keeps the global batch of the smallest size, so each worker's share shrinks. tfcluster cannot
change a script's batch by itself: a script that wants both calls ``sweep_batch_size``; the sweep
measures the batch each size really used and says when it is not what the mode asked for.

A job that lost a host for good and goes on with fewer workers (``restart.min_workers``) resumes from
its backup with ``TFCLUSTER_NUM_WORKERS`` below ``TFCLUSTER_PLANNED_WORKERS``: ``reshaped_batch_size``
keeps the planned global batch (per-worker = global / N), so the optimizer sees the same batch and the
learning rate stays right; each step is slower by about planned / N.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..protocol.env import Env


def sweep_batch_size(per_worker: int, env: Mapping[str, str] = os.environ) -> int:
    """``per_worker`` outside a sweep and under weak scaling; under strong scaling the share of the
    baseline's global batch (``per_worker`` x its workers) that falls to each of this size's workers."""
    if env.get(Env.SCALE_MODE) != "strong":
        return per_worker
    try:
        workers = int(env.get(Env.SCALE_WORKERS) or 0)
        base = int(env.get(Env.SCALE_BASE_WORKERS) or 0)
    except ValueError:
        return per_worker
    if workers <= 0 or base <= 0:
        return per_worker
    return max(1, round(per_worker * base / workers))


def reshaped_batch_size(per_worker: int, env: Mapping[str, str] = os.environ) -> int:
    """``per_worker`` as planned; in an attempt with fewer (or more) workers than planned, the share of
    the planned global batch (``per_worker`` x the planned workers) that falls to each of them."""
    try:
        workers = int(env.get(Env.NUM_WORKERS) or 0)
        planned = int(env.get(Env.PLANNED_WORKERS) or 0)
    except ValueError:
        return per_worker
    if workers <= 0 or planned <= 0 or workers == planned:
        return per_worker
    return max(1, round(per_worker * planned / workers))
