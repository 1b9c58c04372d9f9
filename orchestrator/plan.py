"""The plan: what every node will run, as a pure function of the spec (and of ~/.ssh/config, if given).

Nothing here touches the network or the clock; `tfcluster plan` prints exactly what `launch` uses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .shellquote import exec_line
from .spec import ClusterSpec

WORKER_ENTRY_MODULE = "worker_entry"
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH)", re.IGNORECASE)
REDACTED = "<redacted>"


@dataclass(frozen=True, order=True)
class TaskId:
    """A task of the MWMS cluster: ('chief', 0) or ('worker', i)."""

    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def slug(self) -> str:
        """File-name form: worker-1."""
        return f"{self.type}-{self.index}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        kind, sep, idx = text.replace("-", ":").partition(":")
        if not sep or kind not in ("chief", "worker") or not idx.isdigit():
            raise ValueError(f"{text!r} is not a task (expected chief:0 or worker:N)")
        return cls(kind, int(idx))


@dataclass(frozen=True)
class SshTarget:
    """How to reach a node: the resolved ~/.ssh/config view of a spec host."""

    address: str  # as written in the spec (label)
    hostname: str  # what we connect to (ssh config HostName, else address)
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_command: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 10.0
    keepalive_s: float = 5.0

    @property
    def label(self) -> str:
        return self.address if self.port == 22 else f"{self.address}:{self.port}"


@dataclass(frozen=True)
class NodePlan:
    """The blueprint of one task (what runs where); the live task is the supervisor's business."""

    task: TaskId
    ssh: SshTarget
    tf_address: str
    tf_port: int
    gpus: int
    tf_config: dict[str, Any]
    env: dict[str, str]
    argv: tuple[str, ...]  # remote worker_entry invocation
    command: tuple[str, ...]  # the user's training command
    workdir: str | None
    remote_dir: str  # per-job, per-task directory on the node (may start with ~)
    checkpoint_dir: str
    backup_dir: str

    @property
    def host(self) -> str:
        return self.ssh.address

    @property
    def is_chief(self) -> bool:
        """The task whose checkpoints are the real ones (MWMS: chief, or worker 0 without a chief)."""
        return self.task.type == "chief" or (
            self.task == TaskId("worker", 0) and "chief" not in self.tf_config["cluster"]
        )

    def shell_line(self) -> str:
        """The one line the login shell runs: no user data in it, only the interpreter."""
        return exec_line(self.argv)

    def worker_config(self, *, attempt: int, spec: ClusterSpec, wait_for_go: bool = True) -> dict[str, Any]:
        """The JSON worker_entry reads from stdin: everything it needs, nothing through a shell."""
        env = dict(self.env)
        env["TFCLUSTER_ATTEMPT"] = str(attempt)
        return {
            "wire": 1,
            "job": spec.name,
            "task": {"type": self.task.type, "index": self.task.index},
            "attempt": attempt,
            "argv": list(self.command),
            "workdir": self.workdir,
            "env": env,
            "remote_dir": f"{self.remote_dir}/attempt-{attempt}",
            "tf_port": self.tf_port,
            "gpus": self.gpus,
            "heartbeat_interval_s": spec.heartbeat.interval_s,
            # The node gives up on a silent launcher a little before the launcher gives up on the
            # node, so a cut-off host has stopped its task by the time the job is declared lost.
            "launcher_timeout_s": max(spec.heartbeat.timeout_s - 1.0, 2.0 * spec.heartbeat.interval_s),
            "stop_grace_s": spec.job.stop_grace_s,
            "failure_grace_s": spec.job.failure_grace_s,
            "instrument": spec.job.instrument,
            "wait_for_go": wait_for_go,
        }

    def to_dict(self, *, show_secrets: bool = False) -> dict[str, Any]:
        return {
            "host": self.host,
            "ssh_host": self.ssh.hostname,
            "ssh_port": self.ssh.port,
            "user": self.ssh.user,
            "task": {"type": self.task.type, "index": self.task.index},
            "tf_address": f"{_bracket(self.tf_address)}:{self.tf_port}",
            "gpus": self.gpus,
            "tf_config": self.tf_config,
            "env": self.env if show_secrets else redact_env(self.env),
            "argv": list(self.argv),
            "shell_line": self.shell_line(),
            "command": list(self.command),
            "workdir": self.workdir,
            "remote_dir": self.remote_dir,
            "checkpoint_dir": self.checkpoint_dir,
            "backup_dir": self.backup_dir,
        }


@dataclass(frozen=True)
class Plan:
    job: str
    run_id: str
    communication: str
    nodes: tuple[NodePlan, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def chief(self) -> NodePlan:
        return next(n for n in self.nodes if n.is_chief)

    def node(self, task: TaskId) -> NodePlan:
        return next(n for n in self.nodes if n.task == task)

    def to_dict(self, *, show_secrets: bool = False) -> dict[str, Any]:
        return {
            "job": self.job,
            "run_id": self.run_id,
            "communication": self.communication,
            "nodes": [n.to_dict(show_secrets=show_secrets) for n in self.nodes],
            "warnings": list(self.warnings),
        }

    def to_json(self, *, show_secrets: bool = False) -> str:
        return json.dumps(self.to_dict(show_secrets=show_secrets), indent=2)


SshLookup = Callable[[str], Mapping[str, Any]]


def build_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    local_user: str,
    ssh_lookup: SshLookup | None = None,
) -> Plan:
    """Resolve every host's SSH target, task, TF_CONFIG and environment. Pure: same input, same plan.

    `ssh_lookup(address)` returns the ~/.ssh/config options for a host (paramiko's SSHConfig.lookup
    shape: hostname, user, port, identityfile, proxycommand); explicit spec values win over it.
    """
    targets = [_ssh_target(spec, h, local_user, ssh_lookup) for h in spec.hosts]
    tf_addrs = [h.tf_address or t.hostname for h, t in zip(spec.hosts, targets, strict=True)]
    tf_ports = [h.tf_port or spec.tensorflow.port for h in spec.hosts]
    endpoints = [f"{_bracket(a)}:{p}" for a, p in zip(tf_addrs, tf_ports, strict=True)]

    tasks: list[TaskId] = []
    cluster: dict[str, list[str]] = {}
    for i, ep in enumerate(endpoints):
        if spec.tensorflow.chief and i == 0:
            tasks.append(TaskId("chief", 0))
            cluster.setdefault("chief", []).append(ep)
        else:
            tasks.append(TaskId("worker", len(cluster.get("worker", []))))
            cluster.setdefault("worker", []).append(ep)

    gpus = spec.hosts[0].gpus
    communication = resolve_communication(spec.tensorflow.communication, gpus)
    job_root = f"{spec.job.remote_dir.rstrip('/')}/{run_id}"
    checkpoint_dir = spec.checkpoint.dir or f"{job_root}/checkpoints"
    backup_dir = spec.restart.backup_dir or f"{job_root}/backup"

    warnings = []
    if spec.tensorflow.communication == "nccl" and gpus == 0:
        warnings.append("communication: nccl without GPUs; TensorFlow falls back to ring with a warning")

    nodes = []
    for i, host in enumerate(spec.hosts):
        task = tasks[i]
        tf_config = {
            "cluster": cluster,
            "task": {"type": task.type, "index": task.index},
            "rpc_layer": "grpc",
        }
        env = _node_env(spec, task, tf_config, communication, run_id, len(spec.hosts), checkpoint_dir, backup_dir)
        nodes.append(
            NodePlan(
                task=task,
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
            )
        )
    return Plan(
        job=spec.name,
        run_id=run_id,
        communication=communication,
        nodes=tuple(nodes),
        warnings=tuple(warnings),
    )


def resolve_communication(setting: str, gpus: int) -> str:
    """auto → nccl on GPU tasks (fastest all-reduce between GPUs), ring on CPU (gRPC)."""
    if setting == "auto":
        return "nccl" if gpus > 0 else "ring"
    return setting


def _node_env(
    spec: ClusterSpec,
    task: TaskId,
    tf_config: dict,
    communication: str,
    run_id: str,
    num_tasks: int,
    checkpoint_dir: str,
    backup_dir: str,
) -> dict[str, str]:
    is_chief = task.type == "chief" or (task.type == "worker" and task.index == 0 and not spec.tensorflow.chief)
    hb = spec.heartbeat
    env: dict[str, str] = {
        # Lines must reach the launcher as they are printed, not when a 8 KiB buffer fills.
        "PYTHONUNBUFFERED": "1",
        "TF_CONFIG": json.dumps(tf_config, separators=(",", ":")),
    }
    if spec.tensorflow.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env.update(
        {
            "TFCLUSTER_JOB": spec.name,
            "TFCLUSTER_RUN_ID": run_id,
            "TFCLUSTER_TASK_TYPE": task.type,
            "TFCLUSTER_TASK_INDEX": str(task.index),
            "TFCLUSTER_NUM_TASKS": str(num_tasks),
            "TFCLUSTER_IS_CHIEF": "1" if is_chief else "0",
            "TFCLUSTER_NUM_GPUS": str(spec.hosts[0].gpus),
            "TFCLUSTER_COMMUNICATION": communication,
            "TFCLUSTER_CHECKPOINT_DIR": checkpoint_dir,
            "TFCLUSTER_BACKUP_DIR": backup_dir,
            "TFCLUSTER_INSTRUMENT": "1" if spec.job.instrument else "0",
            "TFCLUSTER_HEARTBEAT_TIMEOUT_S": _num(hb.timeout_s),
            "TFCLUSTER_PROFILE_INTERVAL_S": _num(hb.profile_interval_s),
        }
    )
    if spec.tensorflow.collective_timeout_s is not None:
        env["TFCLUSTER_COLLECTIVE_TIMEOUT_S"] = _num(spec.tensorflow.collective_timeout_s)
    if communication == "nccl":
        # NCCL is silent on failure by default; WARN puts the reason of a failed all-reduce in the log.
        env["NCCL_DEBUG"] = "WARN"
    env.update(spec.job.env)
    return env


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide values whose names look like credentials (API keys, tokens, passwords)."""
    return {k: (REDACTED if SECRET_NAME_RE.search(k) and v else v) for k, v in env.items()}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _ssh_target(spec: ClusterSpec, host: Any, local_user: str, ssh_lookup: SshLookup | None) -> SshTarget:
    cfg: Mapping[str, Any] = ssh_lookup(host.address) if ssh_lookup else {}
    identity = host.identity_file or spec.ssh.identity_file
    identities: tuple[str, ...] = (identity,) if identity else tuple(cfg.get("identityfile", ()) or ())
    port = host.port or spec.ssh.port or _int(cfg.get("port")) or 22
    known_hosts = spec.ssh.known_hosts
    return SshTarget(
        address=host.address,
        hostname=str(cfg.get("hostname") or host.address),
        port=port,
        user=host.user or spec.ssh.user or str(cfg.get("user") or local_user),
        identity_files=identities,
        proxy_command=cfg.get("proxycommand") or None,
        known_hosts=known_hosts,
        connect_timeout_s=spec.ssh.connect_timeout_s,
        keepalive_s=spec.ssh.keepalive_s,
    )


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
