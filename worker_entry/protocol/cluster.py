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
