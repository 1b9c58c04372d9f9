"""The parts every scheduler's planner shares: tasks in order, TF_CONFIG, directories, the runtime and the
environment of a task. Pure. The planners themselves live in their scheduler's package
(``orchestrator/schedulers/<name>/plan.py``)."""

from __future__ import annotations

import json
from typing import Any

from worker_entry.protocol import Env
from worker_entry.protocol.cluster import is_chief, task_order

from ..spec import ClusterSpec
from .model import Runtime, TaskId


def assign_tasks(n: int, chief: bool) -> list[TaskId]:
    """MWMS task per slot, in rank order (``protocol.task_order``: the nodes that build their own
    TF_CONFIG use the same rule)."""
    return [TaskId(t, i) for t, i in task_order(n, chief)]


def tf_cluster(tasks: list[TaskId], endpoints: list[str]) -> dict[str, list[str]]:
    cluster: dict[str, list[str]] = {}
    for task, ep in zip(tasks, endpoints, strict=True):
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
) -> dict[str, str]:
    """The environment of a task's training command (TF_CONFIG omitted when the node builds it)."""
    hb = spec.heartbeat
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
            Env.IS_CHIEF: "1" if is_chief(task.type, task.index, spec.tensorflow.chief) else "0",
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
