"""The parts every scheduler's planner shares: tasks in order, TF_CONFIG, directories, the runtime and the
environment of a task. Pure. The planners themselves live in their scheduler's package
(``orchestrator/schedulers/<name>/plan.py``)."""

from __future__ import annotations

import json
from typing import Any

from worker_entry.protocol import Env
from worker_entry.protocol.cluster import is_chief, task_order
from worker_entry.protocol.roles import CLUSTER_ROLES, ROLES

from ..spec import ClusterSpec
from .model import Runtime, TaskId


def assign_tasks(n: int, chief: bool) -> list[TaskId]:
    """MWMS task per slot, in rank order (``protocol.task_order``: the nodes that build their own
    TF_CONFIG use the same rule)."""
    return [TaskId(t, i) for t, i in task_order(n, chief)]


def role_slots(host_roles: list[dict[str, int]]) -> list[tuple[int, TaskId, int]]:
    """(host index, task, port offset on its host) of every task, in rank order: every chief, then every
    worker, ps and evaluator, each role in host order. A host's cluster tasks take its tf_port, +1, ...
    in that order; an evaluator takes none (-1). Hosts without roles (one task each) give exactly
    ``assign_tasks``' order."""
    used = [0] * len(host_roles)
    out = []
    for role in ROLES:
        index = 0
        for h, roles in enumerate(host_roles):
            for _ in range(roles.get(role, 0)):
                offset = used[h] if role in CLUSTER_ROLES else -1
                used[h] += role in CLUSTER_ROLES
                out.append((h, TaskId(role, index), offset))
                index += 1
    return out


def tf_cluster(tasks: list[TaskId], endpoints: list[str]) -> dict[str, list[str]]:
    """TF_CONFIG's cluster: every task of a cluster role (an evaluator is left out, as TF's docs do)."""
    cluster: dict[str, list[str]] = {}
    for task, ep in zip(tasks, endpoints, strict=True):
        if task.type in CLUSTER_ROLES:
            cluster.setdefault(task.type, []).append(ep)
    return cluster


def tf_config_of(cluster: dict[str, list[str]], task: TaskId) -> dict[str, Any]:
    return {"cluster": cluster, "task": {"type": task.type, "index": task.index}, "rpc_layer": "grpc"}


def job_dirs(spec: ClusterSpec, run_id: str) -> tuple[str, str, str]:
    """(per-job directory on the nodes, checkpoint dir, backup dir)."""
    job_root = f"{spec.job.remote_dir.rstrip('/')}/{run_id}"
    return job_root, spec.checkpoint.dir or f"{job_root}/checkpoints", spec.restart.backup_dir or f"{job_root}/backup"


def runtime_of(spec: ClusterSpec) -> Runtime:
    hb = spec.heartbeat
    return Runtime(
        job=spec.name,
        heartbeat_interval_s=hb.interval_s,
        heartbeat_timeout_s=hb.timeout_s,
        stop_grace_s=spec.job.stop_grace_s,
        failure_grace_s=spec.job.failure_grace_s,
        instrument=spec.job.instrument,
        gather_checkpoint=spec.checkpoint.gather,
    )


def plan_warnings(spec: ClusterSpec, gpus: int) -> list[str]:
    if spec.tensorflow.communication == "nccl" and gpus == 0:
        return ["communication: nccl without GPUs; TensorFlow falls back to ring with a warning"]
    return []


def resolve_communication(setting: str, gpus: int) -> str:
    """auto → nccl on GPU tasks (fastest all-reduce between GPUs), ring on CPU (gRPC)."""
    if setting == "auto":
        return "nccl" if gpus > 0 else "ring"
    return setting


def node_env(
    spec: ClusterSpec,
    task: TaskId,
    tf_config: dict | None,
    communication: str,
    run_id: str,
    num_tasks: int,
    gpus: int,
    checkpoint_dir: str,
    backup_dir: str,
    *,
    has_chief: bool | None = None,
) -> dict[str, str]:
    """The environment of a task's training command (TF_CONFIG omitted when the node builds it;
    ``has_chief`` then says whether its cluster has a chief)."""
    hb = spec.heartbeat
    if has_chief is None:
        has_chief = spec.tensorflow.chief or (tf_config is not None and "chief" in tf_config["cluster"])
    env: dict[str, str] = {
        # Lines must reach the launcher as they are printed, not when a 8 KiB buffer fills.
        "PYTHONUNBUFFERED": "1",
    }
    if tf_config is not None:
        env[Env.TF_CONFIG] = json.dumps(tf_config, separators=(",", ":"))
    if spec.tensorflow.legacy_keras:
        env[Env.LEGACY_KERAS] = "1"
    env.update(
        {
            Env.JOB: spec.name,
            Env.RUN_ID: run_id,
            Env.TASK_TYPE: task.type,
            Env.TASK_INDEX: str(task.index),
            Env.NUM_TASKS: str(num_tasks),
            Env.IS_CHIEF: "1" if is_chief(task.type, task.index, has_chief) else "0",
            Env.NUM_GPUS: str(gpus),
            Env.COMMUNICATION: communication,
            Env.CHECKPOINT_DIR: checkpoint_dir,
            Env.BACKUP_DIR: backup_dir,
            Env.INSTRUMENT: "1" if spec.job.instrument else "0",
            Env.HEARTBEAT_TIMEOUT_S: _num(hb.timeout_s),
            Env.PROFILE_INTERVAL_S: _num(hb.profile_interval_s),
        }
    )
    if spec.tensorflow.collective_timeout_s is not None:
        env[Env.COLLECTIVE_TIMEOUT_S] = _num(spec.tensorflow.collective_timeout_s)
    if communication == "nccl":
        # NCCL is silent on failure by default; WARN puts the reason of a failed all-reduce in the log.
        env["NCCL_DEBUG"] = "WARN"
    env.update(spec.job.env)
    return env


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
