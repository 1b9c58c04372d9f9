"""The parts every scheduler's planner shares: tasks in order, the cluster, directories, the runtime, the
environment, and the one builder of a plan from a planner's placements (``build_plan``). Pure. The
planners themselves live in their scheduler's package (``orchestrator/schedulers/<name>/plan.py``):
each decides where its tasks run, nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker_entry.protocol import Env
from worker_entry.protocol.cluster import task_order
from worker_entry.protocol.roles import CLUSTER_ROLES, ROLES

from ..spec import ClusterSpec
from .model import WORKER_ENTRY_MODULE, Common, NodePlan, Plan, Runtime, SshTarget, TaskId
from .policy import StragglerPolicy


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


@dataclass(frozen=True)
class Placement:
    """Where one task runs, as its scheduler's planner decides: everything else of a ``NodePlan`` is the
    same for every scheduler (``build_plan``)."""

    task: TaskId
    host: str  # as the user names it: the spec address, a Slurm node, a pod's DNS name
    tf_address: str
    tf_port: int  # 0: none of its own (an evaluator), or derived on the node
    gpus: int
    endpoint: str  # what its peers dial, as TF_CONFIG's cluster names it (a template where the node fills it in)
    ssh: SshTarget | None = None


def build_plan(
    spec: ClusterSpec,
    run_id: str,
    placements: list[Placement],
    *,
    entry: tuple[str, ...] = (),
    task_root: str,
    dirs: tuple[str, str],
    communication: str,
    warnings: list[str],
    extras: dict[str, Any] | None = None,
    node_builds_cluster: bool = False,
    roles: dict[str, int] | None = None,
    spares: tuple[str, ...] = (),
    planned_workers: int | None = None,
    members: tuple[str, ...] = (),
) -> Plan:
    """The one builder of a ``Plan`` and its ``NodePlan``s from a planner's placements (rank order):
    the cluster, the environment and the directories every task shares, kept once (``Common``).
    ``entry``: worker_entry's mode (``slurm``, ``kubernetes``); ``dirs``: (checkpoint, backup);
    ``spares``: the hosts standing by (issue 34); ``planned_workers``: the job's workers as planned, when
    this plan has fewer (a reshape without a spare), else this plan's own; ``members``: each task's host
    as a reshape names it (a host with several tasks: once per task), else ()."""
    cluster = tf_cluster([pl.task for pl in placements], [pl.endpoint for pl in placements])
    workers = sum(1 for pl in placements if pl.task.type in ("chief", "worker"))
    planned = planned_workers if planned_workers is not None else workers
    checkpoint_dir, backup_dir = dirs
    common = Common(
        argv=(spec.job.python, "-m", WORKER_ENTRY_MODULE, *entry),
        command=tuple(spec.job.command),
        workdir=spec.job.workdir,
        task_root=task_root,
        checkpoint_dir=checkpoint_dir,
        backup_dir=backup_dir,
        runtime=runtime_of(spec),
        env={
            **common_env(spec, communication, run_id, len(placements), checkpoint_dir, backup_dir),
            Env.NUM_WORKERS: str(workers),
            Env.PLANNED_WORKERS: str(planned),
            **spec.job.env,  # the user's word last, as in common_env
        },
        cluster=cluster,
        node_builds_cluster=node_builds_cluster,
        roles=dict(roles or {}),
        backup_shared=spec.restart.backup_shared,
    )
    nodes = tuple(
        NodePlan(
            task=pl.task,
            host=pl.host,
            ssh=pl.ssh,
            tf_address=pl.tf_address,
            tf_port=pl.tf_port,
            gpus=pl.gpus,
            common=common,
        )
        for pl in placements
    )
    return Plan(
        job=spec.name,
        run_id=run_id,
        communication=communication,
        nodes=nodes,
        common=common,
        warnings=tuple(warnings),
        scheduler=spec.scheduler,
        extras=extras,
        policy=StragglerPolicy.from_spec(spec),
        strategy=spec.tensorflow.strategy,
        spares=tuple(spares),
        planned_workers=planned,
        members=tuple(members) if len(members) == len(placements) else (),
    )


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


def common_env(
    spec: ClusterSpec, communication: str, run_id: str, num_tasks: int, checkpoint_dir: str, backup_dir: str
) -> dict[str, str]:
    """The environment every task's training command gets; with ``task_env`` a task's whole environment
    but TF_CONFIG, which worker_entry builds on the node from the cluster."""
    hb = spec.heartbeat
    env: dict[str, str] = {
        # Lines must reach the launcher as they are printed, not when a 8 KiB buffer fills.
        "PYTHONUNBUFFERED": "1",
    }
    if spec.tensorflow.legacy_keras:
        env[Env.LEGACY_KERAS] = "1"
    env.update(
        {
            Env.JOB: spec.name,
            Env.RUN_ID: run_id,
            Env.NUM_TASKS: str(num_tasks),
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
