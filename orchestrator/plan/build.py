"""Build the plan from a spec: task per host, TF_CONFIG, environment, SSH target. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from worker_entry.protocol import Env

from ..core.errors import UsageError
from ..spec import ClusterSpec
from .model import WORKER_ENTRY_MODULE, NodePlan, Plan, Runtime, TaskId, bracket
from .policy import StragglerPolicy
from .ssh_targets import SshLookup, ssh_target

#: Planners of the schedulers that start tasks for us, by ``spec.scheduler``. Their modules register
#: here (``plan/__init__`` imports them), so they can reuse this module's helpers without a cycle.
SCHEDULER_PLANS: dict[str, Callable[..., Plan]] = {}


def build_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    local_user: str,
    ssh_lookup: SshLookup | None = None,
) -> Plan:
    """The plan of a spec, for its scheduler. Pure: same input, same plan."""
    if spec.scheduler == "ssh":
        return _ssh_plan(spec, run_id=run_id, local_user=local_user, ssh_lookup=ssh_lookup)
    if spec.scheduler in SCHEDULER_PLANS:
        return SCHEDULER_PLANS[spec.scheduler](spec, run_id=run_id)
    raise UsageError(f"scheduler: {spec.scheduler} is not supported by this version of tfcluster")


def assign_tasks(n: int, chief: bool) -> list[TaskId]:
    """MWMS task per slot, in order: chief:0 first when there is a chief, then worker:0, worker:1, ..."""
    if chief:
        return [TaskId("chief", 0)] + [TaskId("worker", i) for i in range(n - 1)]
    return [TaskId("worker", i) for i in range(n)]


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


def _ssh_plan(spec: ClusterSpec, *, run_id: str, local_user: str, ssh_lookup: SshLookup | None) -> Plan:
    """Resolve every host's SSH target, task, TF_CONFIG and environment.

    `ssh_lookup(address)` returns the ~/.ssh/config options for a host (paramiko's SSHConfig.lookup
    shape: hostname, user, port, identityfile, proxycommand); explicit spec values win over it.
    """
    hosts = spec.hosts or []
    warnings = plan_warnings(spec, hosts[0].gpus)
    targets = [ssh_target(spec, h, local_user, ssh_lookup, warnings) for h in hosts]
    tf_addrs = [h.tf_address or t.hostname for h, t in zip(hosts, targets, strict=True)]
    tf_ports = [h.tf_port or spec.tensorflow.port for h in hosts]
    endpoints = [f"{bracket(a)}:{p}" for a, p in zip(tf_addrs, tf_ports, strict=True)]
    tasks = assign_tasks(len(hosts), spec.tensorflow.chief)
    cluster = tf_cluster(tasks, endpoints)
    gpus = hosts[0].gpus
    communication = resolve_communication(spec.tensorflow.communication, gpus)
    job_root, checkpoint_dir, backup_dir = job_dirs(spec, run_id)
    runtime = runtime_of(spec)
    nodes = []
    for i, host in enumerate(hosts):
        task = tasks[i]
        tf_config = tf_config_of(cluster, task)
        env = node_env(spec, task, tf_config, communication, run_id, len(hosts), gpus, checkpoint_dir, backup_dir)
        nodes.append(
            NodePlan(
                task=task,
                host=host.address,
                ssh=targets[i],
                tf_address=tf_addrs[i],
                tf_port=tf_ports[i],
                gpus=host.gpus,
                tf_config=tf_config,
                env=env,
                argv=(spec.job.python, "-m", WORKER_ENTRY_MODULE),
                command=tuple(spec.job.command),
                workdir=spec.job.workdir,
                remote_dir=f"{job_root}/{task.slug}",
                checkpoint_dir=checkpoint_dir,
                backup_dir=backup_dir,
                runtime=runtime,
            )
        )
    return Plan(
        job=spec.name,
        run_id=run_id,
        communication=communication,
        nodes=tuple(nodes),
        warnings=tuple(warnings),
        scheduler=spec.scheduler,
        policy=StragglerPolicy.from_spec(spec),
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
    is_chief = task.type == "chief" or (task.type == "worker" and task.index == 0 and not spec.tensorflow.chief)
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
            Env.IS_CHIEF: "1" if is_chief else "0",
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
