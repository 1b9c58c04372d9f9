"""The MWMS cluster's shape, one rule each, for the planner and for nodes that build their own TF_CONFIG
(Slurm, Kubernetes): which task has which rank, which task is the chief, and TF_CONFIG itself.

TF_CONFIG names every task, so a plan never stores it per task (that grows with the square of the
tasks): the plan keeps the cluster once, a ``NodeConfig`` carries it once per connection
(``NodeConfig.cluster``) and worker_entry builds the task's TF_CONFIG (``tf_config``) where it starts
the command. How large a cluster may be: ``MAX_TASKS`` endpoints of at most ``MAX_ENDPOINT``
characters (``frames.MAX_CONFIG_LINE`` is sized from them)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: The most tasks a cluster may have (4x the 16,384 a plan is measured at: docs/benchmarks.md).
MAX_TASKS = 1 << 16
#: The longest ``HOST:PORT`` of a cluster: a 253-character DNS name, brackets, a port.
MAX_ENDPOINT = 300


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> dict[str, Any]:
    """A task's TF_CONFIG: exactly what ``TFConfigClusterResolver`` reads. The one place its shape is
    written (the planner's ``plan --task``, worker_entry over SSH, Slurm and Kubernetes, a task
    restarted in place)."""
    return {
        "cluster": {k: list(v) for k, v in cluster.items()},
        "task": {"type": task_type, "index": index},
        "rpc_layer": "grpc",
    }


def tf_config_json(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """``tf_config`` as the compact JSON the ``TF_CONFIG`` variable holds."""
    return json.dumps(tf_config(cluster, task_type, index), separators=(",", ":"))


def cluster_endpoint(cluster: Mapping[str, Sequence[str]], task: Any) -> str | None:
    """A task's own entry in a cluster (None for an evaluator, which is outside it)."""
    try:
        endpoint = cluster.get(task.type, [])[task.index]
    except (AttributeError, IndexError, TypeError):
        return None
    return endpoint if isinstance(endpoint, str) and len(endpoint) <= MAX_ENDPOINT else None


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
    """A task's own entry in a TF_CONFIG text's cluster (None for an evaluator, or without TF_CONFIG)."""
    try:
        cluster = json.loads(tf_config or "{}").get("cluster") or {}
    except (ValueError, AttributeError, RecursionError):
        return None
    return cluster_endpoint(cluster, task) if isinstance(cluster, dict) else None


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
