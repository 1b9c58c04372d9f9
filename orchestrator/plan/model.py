"""The plan: what every node will run, as a pure function of the spec (and of ~/.ssh/config, if given).

Nothing here touches the network or the clock; `tfcluster plan` prints exactly what `launch` uses. Its
record in the run directory (plan.json) is ``record.PlanRecord``; the planners build it through
``build.build_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker_entry import protocol as p

from .policy import StragglerPolicy
from .quoting import exec_line
from .roles import rules_table

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
        # (ASCII digits, at most 9: "worker:<5000 digits>" got Python's own int-conversion message)
        if not sep or kind not in p.ROLES or not (idx.isascii() and idx.isdigit() and len(idx) <= 9):
            raise ValueError(f"{text[:60]!r} is not a task (expected chief:0, worker:N, ps:N or evaluator:0)")
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


#: waiting heartbeats a second the launcher reads, at most, from the nodes waiting for the go (``Runtime``)
WAITING_HEARTBEATS_PER_S = 512


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

    def waiting_heartbeat_s(self, tasks: int) -> float:
        """How often a node heartbeats while it waits for the go: the interval up to
        ``WAITING_HEARTBEATS_PER_S`` tasks; beyond, spread so the launcher reads at most that many waiting
        heartbeats a second while the others dial in (at 4,096 tasks they were ~108k records, half the
        launcher's start: docs/benchmarks.md §11). At most half the heartbeat timeout: a teardown before
        the go still hears every waiting node in time."""
        spread = min(tasks / WAITING_HEARTBEATS_PER_S, self.heartbeat_timeout_s / 2)
        return max(self.heartbeat_interval_s, spread)

    @property
    def launcher_timeout_s(self) -> float:
        """The node gives up on a silent launcher a little before the launcher gives up on the node,
        so a cut-off host has stopped its task by the time the job is declared lost."""
        return max(self.heartbeat_timeout_s - 1.0, 2.0 * self.heartbeat_interval_s)


@dataclass(frozen=True)
class Common:
    """What every task of a plan shares, kept once: a plan grows with its tasks, not with their square.

    The cluster (every task's endpoint by role) is here, not in each task: a task's TF_CONFIG is built
    where it is used (``tf_config``: ``plan --task``, worker_entry on the node)."""

    argv: tuple[str, ...]  # remote worker_entry invocation
    command: tuple[str, ...]  # the user's training command
    workdir: str | None
    task_root: str  # each task's directory on its node: TASK_ROOT/<type>-<index> (may start with ~)
    checkpoint_dir: str
    backup_dir: str
    runtime: Runtime
    env: dict[str, str]  # every task's environment but its own part (``model.task_env``), without TF_CONFIG
    # TF_CONFIG's cluster (an evaluator is outside it); every NodeConfig of the plan refers to this one object
    cluster: dict[str, list[str]]
    # the nodes build their cluster themselves (Slurm: ``cluster`` is a template for display, never sent)
    node_builds_cluster: bool = False
    # the job's tasks by role, for nodes that build their own TF_CONFIG from their rank (Slurm with roles)
    roles: dict[str, int] = field(default_factory=dict)
    # restart.backup_shared: every host sees the same backup_dir, so the chief's backup is never copied off it
    backup_shared: bool = False

    @property
    def has_chief(self) -> bool:
        return "chief" in self.cluster


@dataclass(frozen=True)
class NodePlan:
    """The blueprint of one task (what runs where); the live task is the supervisor's business. What all
    tasks share is the plan's ``Common``, one object."""

    task: TaskId
    host: str  # where it runs, as the user names it: the spec address (ssh) or a scheduler slot
    ssh: SshTarget | None  # how the launcher reaches it over SSH (None: a scheduler starts it)
    tf_address: str
    tf_port: int
    gpus: int
    common: Common = field(repr=False, compare=False)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.common.argv

    @property
    def command(self) -> tuple[str, ...]:
        return self.common.command

    @property
    def workdir(self) -> str | None:
        return self.common.workdir

    @property
    def runtime(self) -> Runtime:
        return self.common.runtime

    @property
    def checkpoint_dir(self) -> str:
        return self.common.checkpoint_dir

    @property
    def backup_dir(self) -> str:
        return self.common.backup_dir

    @property
    def remote_dir(self) -> str:
        """Its per-job, per-task directory on the node."""
        return f"{self.common.task_root}/{self.task.slug}"

    @property
    def is_chief(self) -> bool:
        """The task whose checkpoints are the real ones (MWMS: chief, or worker 0 without a chief)."""
        return p.is_chief(self.task.type, self.task.index, self.common.has_chief)

    @property
    def env(self) -> dict[str, str]:
        """Its training command's environment, TF_CONFIG aside (``tf_config``; the node adds it)."""
        return {**self.common.env, **task_env(self.task, self.gpus, self.common.has_chief)}

    @property
    def tf_config(self) -> dict[str, Any]:
        """Its TF_CONFIG, built on demand (it names every task: never stored per task)."""
        return p.tf_config(self.common.cluster, self.task.type, self.task.index)

    def shell_line(self) -> str:
        """The one line the login shell runs: no user data in it, only the interpreter."""
        return exec_line(self.argv)

    def node_config(self, attempt: int, *, wait_for_go: bool = True) -> p.NodeConfig:
        """What worker_entry reads from stdin: everything it needs, nothing through a shell. The one
        builder of a ``NodeConfig`` (a pod's comes from its task type's, ``PodConfig``)."""
        env = self.env
        env[p.Env.ATTEMPT] = str(attempt)
        rt, common = self.runtime, self.common
        return p.NodeConfig(
            argv=list(self.command),
            remote_dir=f"{self.remote_dir}/attempt-{attempt}",
            job=rt.job,
            task=p.TaskRef(self.task.type, self.task.index),  # type: ignore[arg-type]
            attempt=attempt,
            workdir=self.workdir,
            env=env,
            cluster={} if common.node_builds_cluster else common.cluster,
            tf_port=self.tf_port or None,  # an evaluator has no TF server
            gpus=self.gpus,
            heartbeat_interval_s=rt.heartbeat_interval_s,
            waiting_heartbeat_s=rt.waiting_heartbeat_s(sum(map(len, common.cluster.values()))),
            launcher_timeout_s=rt.launcher_timeout_s,
            stop_grace_s=rt.stop_grace_s,
            failure_grace_s=rt.failure_grace_s,
            instrument=rt.instrument,
            wait_for_go=wait_for_go,
            checkpoint_dir=self.checkpoint_dir if self.is_chief and rt.gather_checkpoint else None,
            # MWMS makes every non-chief write a temporary copy of each checkpoint: not worth keeping
            clean_dirs=[] if self.is_chief else [self.checkpoint_dir, self.backup_dir],
            roles=dict(common.roles),
        )

    @property
    def tf_endpoint(self) -> str:
        """``ADDRESS:PORT`` as the plan shows it (IPv6 in brackets)."""
        return f"{bracket(self.tf_address)}:{self.tf_port}"


@dataclass(frozen=True)
class Plan:
    """Every task in rank order, and what they share once (``common``). ``extras``: the scheduler's own
    part (Slurm: the allocation, the sbatch and srun lines), kept in plan.json under its name."""

    job: str
    run_id: str
    communication: str
    nodes: tuple[NodePlan, ...]
    common: Common
    warnings: tuple[str, ...] = field(default=())
    scheduler: str = ""  # its spec's scheduler: (build_plan)
    extras: dict[str, Any] | None = None
    policy: StragglerPolicy = field(default_factory=StragglerPolicy)  # how stragglers are judged, live and by `report`
    strategy: str = "multi_worker_mirrored"  # tensorflow.strategy: what each role's failure and end mean (plan.roles)
    spares: tuple[str, ...] = ()  # hosts standing by, running nothing until a host is lost for good (issue 34)
    # each task's host as the job's members name it (nodes[i] runs on members[i]; a host with several tasks
    # once for each), where the scheduler can plan without a host (a reshape); () otherwise
    members: tuple[str, ...] = ()
    planned_workers: int = 0  # the job's training tasks as planned (this plan may have fewer: a reshape)

    @property
    def cluster(self) -> dict[str, list[str]]:
        return self.common.cluster

    @property
    def chief(self) -> NodePlan:
        return next(n for n in self.nodes if n.is_chief)

    def node(self, task: TaskId) -> NodePlan:
        return next(n for n in self.nodes if n.task == task)

    @property
    def has_roles(self) -> bool:
        """A parameter-server job, or one with a sidecar evaluator."""
        return self.strategy != "multi_worker_mirrored" or any(n.task.type == "evaluator" for n in self.nodes)

    @property
    def roles_table(self) -> dict[str, dict[str, object]] | None:
        """What each role's failure and end mean (plan.json ``roles``), for jobs with roles."""
        return rules_table(self.strategy) if self.has_roles else None


def task_env(task: TaskId, gpus: int, has_chief: bool) -> dict[str, str]:
    """A task's own variables: what differs between the tasks of a plan (the rest is ``common_env``)."""
    return {
        p.Env.TASK_TYPE: task.type,
        p.Env.TASK_INDEX: str(task.index),
        p.Env.IS_CHIEF: "1" if p.is_chief(task.type, task.index, has_chief) else "0",
        p.Env.NUM_GPUS: str(gpus),
    }


def bracket(address: str) -> str:
    """An address as it goes before ``:port`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address
