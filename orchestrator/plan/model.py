"""The plan: what every node will run, as a pure function of the spec (and of ~/.ssh/config, if given).

Nothing here touches the network or the clock; `tfcluster plan` prints exactly what `launch` uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from worker_entry import protocol as p

from .policy import StragglerPolicy
from .quoting import exec_line
from .roles import rules_table
from .secrets import redact_argv, redact_env

WORKER_ENTRY_MODULE = "worker_entry"


@dataclass(frozen=True, order=True)
class TaskId:
    """A task of the job: ('chief', 0), ('worker', i), ('ps', i) or ('evaluator', 0)."""

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
        if not sep or kind not in p.ROLES or not idx.isdigit():
            raise ValueError(f"{text!r} is not a task (expected chief:0, worker:N, ps:N or evaluator:0)")
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
    jumps: tuple[SshTarget, ...] = ()  # ProxyJump hosts, in the order the connection goes through them

    @property
    def label(self) -> str:
        return self.address if self.port == 22 else f"{self.address}:{self.port}"


@dataclass(frozen=True)
class Runtime:
    """How worker_entry runs and supervises a task: the same for every node of a plan."""

    job: str
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 10.0
    stop_grace_s: float = 10.0
    failure_grace_s: float = 0.3
    instrument: bool = True
    gather_checkpoint: bool = True  # the chief lists its checkpoint directory when its task ends

    @property
    def launcher_timeout_s(self) -> float:
        """The node gives up on a silent launcher a little before the launcher gives up on the node,
        so a cut-off host has stopped its task by the time the job is declared lost."""
        return max(self.heartbeat_timeout_s - 1.0, 2.0 * self.heartbeat_interval_s)


@dataclass(frozen=True)
class NodePlan:
    """The blueprint of one task (what runs where); the live task is the supervisor's business."""

    task: TaskId
    host: str  # where it runs, as the user names it: the spec address (ssh) or a scheduler slot
    ssh: SshTarget | None  # how the launcher reaches it over SSH (None: a scheduler starts it)
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
    runtime: Runtime
    # the job's tasks by role, for nodes that build their own TF_CONFIG from their rank (Slurm with roles)
    roles: dict[str, int] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """The task whose checkpoints are the real ones (MWMS: chief, or worker 0 without a chief)."""
        return p.is_chief(self.task.type, self.task.index, "chief" in self.tf_config["cluster"])

    def shell_line(self) -> str:
        """The one line the login shell runs: no user data in it, only the interpreter."""
        return exec_line(self.argv)

    def node_config(self, attempt: int, *, wait_for_go: bool = True) -> p.NodeConfig:
        """What worker_entry reads from stdin: everything it needs, nothing through a shell."""
        env = dict(self.env)
        env[p.Env.ATTEMPT] = str(attempt)
        rt = self.runtime
        return p.NodeConfig(
            argv=list(self.command),
            remote_dir=f"{self.remote_dir}/attempt-{attempt}",
            job=rt.job,
            task=p.TaskRef(self.task.type, self.task.index),  # type: ignore[arg-type]
            attempt=attempt,
            workdir=self.workdir,
            env=env,
            tf_port=self.tf_port or None,  # an evaluator has no TF server
            gpus=self.gpus,
            heartbeat_interval_s=rt.heartbeat_interval_s,
            launcher_timeout_s=rt.launcher_timeout_s,
            stop_grace_s=rt.stop_grace_s,
            failure_grace_s=rt.failure_grace_s,
            instrument=rt.instrument,
            wait_for_go=wait_for_go,
            checkpoint_dir=self.checkpoint_dir if self.is_chief and rt.gather_checkpoint else None,
            # MWMS makes every non-chief write a temporary copy of each checkpoint: not worth keeping
            clean_dirs=[] if self.is_chief else [self.checkpoint_dir, self.backup_dir],
            roles=dict(self.roles),
        )

    def to_dict(self, *, show_secrets: bool = False, cluster: bool = True) -> dict[str, Any]:
        """``cluster`` False: its TF_CONFIG without the cluster, which names every task (the run's
        plan.json keeps the cluster once: written per task, it grows with the square of the tasks)."""
        env = self.env if show_secrets else redact_env(self.env)
        tf_config = self.tf_config
        if not cluster:
            tf_config = {k: v for k, v in tf_config.items() if k != "cluster"}
            env = {k: v for k, v in env.items() if k != p.Env.TF_CONFIG}
        return {
            "host": self.host,
            **(
                {
                    "ssh_host": self.ssh.hostname,
                    "ssh_port": self.ssh.port,
                    "user": self.ssh.user,
                    "proxy_command": self.ssh.proxy_command,
                    "jumps": [f"{j.user}@{j.hostname}:{j.port}" for j in self.ssh.jumps],
                }
                if self.ssh is not None
                else {}
            ),
            "task": {"type": self.task.type, "index": self.task.index},
            "tf_address": f"{bracket(self.tf_address)}:{self.tf_port}",
            "gpus": self.gpus,
            "tf_config": tf_config,
            "env": env,
            "argv": list(self.argv),
            "shell_line": self.shell_line(),
            "command": list(self.command) if show_secrets else redact_argv(self.command),
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
    scheduler: str = "ssh"
    slurm: dict[str, Any] | None = None  # scheduler slurm: allocation, sbatch/srun lines (plan.slurm)
    policy: StragglerPolicy = field(default_factory=StragglerPolicy)  # how stragglers are judged, live and by `report`
    strategy: str = "multi_worker_mirrored"  # tensorflow.strategy: what each role's failure and end mean (plan.roles)

    @property
    def chief(self) -> NodePlan:
        return next(n for n in self.nodes if n.is_chief)

    def node(self, task: TaskId) -> NodePlan:
        return next(n for n in self.nodes if n.task == task)

    def to_dict(self, *, show_secrets: bool = False, record: bool = False) -> dict[str, Any]:
        """``record``: the run directory's plan.json — the TF_CONFIG cluster once (``cluster``), not in
        every task's ``tf_config`` and ``env`` (50 MB at 1,024 tasks, 800 MB at 4,096)."""
        cluster = self.nodes[0].tf_config.get("cluster") if record and self.nodes else None
        return {
            "job": self.job,
            "run_id": self.run_id,
            "communication": self.communication,
            "scheduler": self.scheduler,
            **({"slurm": self.slurm} if self.slurm is not None else {}),
            **({"cluster": cluster} if record else {}),
            "nodes": [n.to_dict(show_secrets=show_secrets, cluster=not record) for n in self.nodes],
            "warnings": list(self.warnings),
            "policy": self.policy.to_dict(),
            # jobs with roles beyond chief and workers: the strategy and what each role's failure does
            **({"strategy": self.strategy, "roles": rules_table(self.strategy)} if self.has_roles else {}),
        }

    @property
    def has_roles(self) -> bool:
        """A parameter-server job, or one with a sidecar evaluator."""
        return self.strategy != "multi_worker_mirrored" or any(n.task.type == "evaluator" for n in self.nodes)

    def to_json(self, *, show_secrets: bool = False) -> str:
        return json.dumps(self.to_dict(show_secrets=show_secrets), indent=2)


def bracket(address: str) -> str:
    """An address as it goes before ``:port`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address
