"""The MWMS cluster's shape, one rule each, for the planner and for nodes that build their own TF_CONFIG
(Slurm, Kubernetes): which task has which rank, and which task is the chief."""

from __future__ import annotations

import json
from typing import Any


def task_order(n: int, chief: bool) -> list[tuple[str, int]]:
    """(type, index) of each rank: ``chief:0`` first when the cluster has a chief, then ``worker:0..``."""
    if chief:
        return [("chief", 0)] + [("worker", i) for i in range(n - 1)]
    return [("worker", i) for i in range(n)]


def is_chief(task_type: str, index: int, has_chief: bool) -> bool:
    """The task whose checkpoints are the real ones: the chief, or worker 0 when there is no chief
    (what MultiWorkerMirroredStrategy's ``_is_chief`` decides)."""
    return task_type == "chief" or (task_type == "worker" and index == 0 and not has_chief)


def own_endpoint(tf_config: str | None, task: Any) -> str | None:
    """A task's own entry in TF_CONFIG's cluster (None for an evaluator, or without TF_CONFIG)."""
    try:
        endpoint = (json.loads(tf_config or "{}").get("cluster") or {}).get(task.type, [])[task.index]
    except (ValueError, AttributeError, IndexError, TypeError):
        return None
    return endpoint if isinstance(endpoint, str) and len(endpoint) <= 300 else None


def slurm_node_name(env: Any) -> str | None:
    """Slurm's name for this node (``SLURMD_NODENAME``), None outside Slurm or when it is no name."""
    name = env.get("SLURMD_NODENAME") or ""
    return name if 0 < len(name) <= 253 and name.isprintable() and " " not in name else None


def gpu_slice(visible: str, local_id: int, per_task: int, tasks_here: int) -> str | None:
    """This task's share of the node's GPUs: Slurm shows every task of a node all of the step's GPUs
    (``--gpus-per-node``); MWMS wants each task on its own. None: leave CUDA_VISIBLE_DEVICES alone."""
    devices = [d for d in visible.split(",") if d.strip()]
    if per_task <= 0 or tasks_here <= 1 or len(devices) < per_task * tasks_here:
        return None
    return ",".join(devices[local_id * per_task : (local_id + 1) * per_task])
