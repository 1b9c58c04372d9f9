"""The plan record: what a run directory keeps of its plan (RUN/plan.json), and what ``plan --json`` prints.

One writer (``runs.write_plan``), one typed reader (``PlanRecord.from_dict``, ``runs.read_plan``): every
view and scheduler reads this object, never the raw file. It grows linearly with the tasks: the
cluster (every task's endpoint by role), the environment and the directories every task shares are
kept once; a task is its role, index, host, TF endpoint and GPUs (its own variables follow from those:
``model.task_env``; its TF_CONFIG from the cluster: ``tf_config``).

Versions: 3 is this layout: 2 and, where a job has them (issue 34), its spare hosts (``spares``), the
workers as planned (``planned_workers``) and, once a host was lost for good, the attempt this plan is
for (``attempt``) and every earlier reshape (``reshapes``: which host left, why, what came in, each
earlier plan's hosts by task); a record without them reads as a plan with none. 2 is 3 without them.
1 (every tfcluster before it) kept every task's environment and TF_CONFIG
(``nodes``), with the cluster either once at the top (``cluster``, what a launch wrote) or in every
task's TF_CONFIG (a Slurm submit, and the oldest runs); it is read into the same object. A newer
version is refused with a message saying so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker_entry.protocol import Env
from worker_entry.protocol.cluster import tf_config

from ..core.errors import UsageError
from .model import Plan, TaskId
from .policy import StragglerPolicy
from .secrets import redact_argv, redact_env, redact_path

PLAN_VERSION = 3
#: The check workload's module (``job.check.check_spec`` runs it as the job's command).
CHECK_MODULE = "worker_entry.check"
#: A task's own variables in a version-1 record: every task had them (``model.task_env``), none is shared.
_OWN_ENV = frozenset({Env.TASK_TYPE, Env.TASK_INDEX, Env.IS_CHIEF, Env.NUM_GPUS, Env.TF_CONFIG, Env.ATTEMPT})


class PlanRecordError(UsageError, ValueError):
    """plan.json is not a plan record this version reads (damaged, or written by a newer tfcluster)."""


@dataclass(frozen=True)
class TaskRecord:
    """One task of a recorded plan."""

    task: str  # chief:0, worker:3, ...
    host: str | None  # where it ran, as the user names it (spec address, Slurm node, pod)
    gpus: int = 0
    tf_address: str | None = None  # ADDRESS:PORT its peers dial (None: an evaluator, outside the cluster)
    ssh: str | None = None  # USER@HOST:PORT the launcher reached it at (scheduler ssh)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task, "host": self.host, "gpus": self.gpus}
        if self.tf_address is not None:
            out["tf_address"] = self.tf_address
        if self.ssh is not None:
            out["ssh"] = self.ssh
        return out


@dataclass(frozen=True)
class PlanChange:
    """One reshape of the run (issue 34): from ``attempt`` on the plan lost ``out`` and took ``spare_in``
    (or nobody: a worker fewer); ``hosts_before``: the plan it replaced, each task's host."""

    attempt: int
    out: str
    reason: str
    spare_in: str | None
    workers_before: int
    workers_after: int
    lost_ts: float  # when the host failed: the start of "the loss to training again"
    hosts_before: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "out": self.out,
            "reason": self.reason,
            "spare_in": self.spare_in,
            "workers_before": self.workers_before,
            "workers_after": self.workers_after,
            "lost_ts": self.lost_ts,
            "hosts_before": dict(self.hosts_before),
        }

    @classmethod
    def from_dict(cls, d: Any) -> PlanChange | None:
        """A recorded reshape; None where it is damaged (the record's history is for people: skipped)."""
        if not isinstance(d, Mapping):
            return None
        ints = [d.get(k) for k in ("attempt", "workers_before", "workers_after")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            return None
        out, reason, spare = d.get("out"), d.get("reason"), d.get("spare_in")
        lost = d.get("lost_ts")
        if not isinstance(out, str) or not isinstance(reason, str) or not (spare is None or isinstance(spare, str)):
            return None
        before = d.get("hosts_before") if isinstance(d.get("hosts_before"), Mapping) else {}
        return cls(
            attempt=ints[0],
            out=out,
            reason=reason[:2000],
            spare_in=spare,
            workers_before=ints[1],
            workers_after=ints[2],
            lost_ts=float(lost) if isinstance(lost, int | float) and not isinstance(lost, bool) else 0.0,
            hosts_before={str(k): v for k, v in before.items() if isinstance(v, str)},
        )


@dataclass(frozen=True)
class PlanRecord:
    """A run's plan as recorded: read by ``status``, ``report``, ``predict``, ``scale``, the run list and
    the schedulers' handles."""

    job: str
    run_id: str
    tasks: tuple[TaskRecord, ...]
    scheduler: str = "ssh"
    communication: str = "ring"
    strategy: str = "multi_worker_mirrored"
    roles: dict[str, Any] | None = None  # what each role's failure and end mean (jobs with roles)
    warnings: tuple[str, ...] = ()
    policy: StragglerPolicy = field(default_factory=StragglerPolicy)
    cluster: dict[str, list[str]] = field(default_factory=dict)
    common: dict[str, Any] = field(default_factory=dict)  # argv, command, workdir, task_root, dirs, env
    extras: dict[str, Any] | None = None  # the scheduler's own part, under its name (Slurm: sbatch, srun)
    spares: tuple[str, ...] = ()  # hosts standing by for one lost for good (issue 34)
    planned_workers: int | None = None  # the job's workers as planned (None: an older record)
    attempt: int = 0  # the attempt this plan is for: 0, or the first attempt after its reshape
    reshapes: tuple[PlanChange, ...] = ()  # the run's reshapes so far, oldest first
    version: int = PLAN_VERSION

    # --- what the readers ask -------------------------------------------------------------------------

    def hosts(self) -> dict[str, str | None]:
        """Each task's host, by task name."""
        return {t.task: t.host for t in self.tasks}

    @property
    def purpose(self) -> str:
        """``check`` for a run of the check workload (`tfcluster check`, `launch --check`: its command is
        ``PYTHON -m worker_entry.check``, ``job.check.check_spec``), else ``train``. A job's name means
        its latest training run (``runs.resolve_run``): a check must not shadow it."""
        command = self.common.get("command")
        if isinstance(command, list) and any(a == "-m" and b == CHECK_MODULE for a, b in itertools.pairwise(command)):
            return "check"
        return "train"

    def task(self, name: str) -> TaskRecord | None:
        return next((t for t in self.tasks if t.task == name), None)

    def task_dir(self, name: str) -> str | None:
        """A task's directory on its node (its attempts' directories are under it); None if not recorded."""
        root = self.common.get("task_root")
        return f"{root}/{name.replace(':', '-')}" if isinstance(root, str) else None

    def tf_config(self, name: str) -> dict[str, Any]:
        """A task's TF_CONFIG (built here: it names every task, so it is never stored per task)."""
        kind, _, index = name.partition(":")
        return tf_config(self.cluster, kind, int(index))

    # --- writing --------------------------------------------------------------------------------------

    def workers(self) -> int:
        """This plan's training tasks (chief and workers)."""
        return sum(1 for t in self.tasks if t.task.split(":")[0] in ("chief", "worker"))

    @classmethod
    def from_plan(
        cls, plan: Plan, *, show_secrets: bool = False, attempt: int = 0, reshapes: tuple[PlanChange, ...] = ()
    ) -> PlanRecord:
        """The record of a plan; credentials in the environment and command redacted unless asked."""
        c = plan.common
        common = {
            "argv": list(c.argv),
            "shell_line": plan.nodes[0].shell_line() if plan.nodes else "",
            "command": list(c.command) if show_secrets else redact_argv(c.command),
            # (a directory may be a URL with its credentials: s3://KEY:SECRET@bucket)
            "workdir": redact_path(c.workdir, show_secrets),
            "task_root": c.task_root,
            "checkpoint_dir": redact_path(c.checkpoint_dir, show_secrets),
            "backup_dir": redact_path(c.backup_dir, show_secrets),
            "env": dict(c.env) if show_secrets else redact_env(c.env),
            **({"node_builds_cluster": True} if c.node_builds_cluster else {}),
            **({"backup_shared": True} if c.backup_shared else {}),
        }
        tasks = tuple(
            TaskRecord(
                task=str(n.task),
                host=n.host,
                gpus=n.gpus,
                tf_address=n.tf_endpoint if n.task.type in c.cluster else None,
                ssh=f"{n.ssh.user}@{n.ssh.hostname}:{n.ssh.port}" if n.ssh is not None else None,
            )
            for n in plan.nodes
        )
        return cls(
            job=plan.job,
            run_id=plan.run_id,
            tasks=tasks,
            scheduler=plan.scheduler,
            communication=plan.communication,
            strategy=plan.strategy,
            roles=plan.roles_table,
            warnings=plan.warnings,
            policy=plan.policy,
            cluster={k: list(v) for k, v in c.cluster.items()},
            common=common,
            extras=plan.extras,
            spares=plan.spares,
            planned_workers=plan.planned_workers or None,
            attempt=attempt,
            reshapes=reshapes,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "job": self.job,
            "run_id": self.run_id,
            "scheduler": self.scheduler,
            "communication": self.communication,
            # jobs with roles beyond chief and workers: the strategy and what each role's failure does
            **({"strategy": self.strategy, "roles": self.roles} if self.roles else {}),
            "warnings": list(self.warnings),
            "policy": self.policy.to_dict(),
            "cluster": self.cluster,
            "common": self.common,
            "tasks": [t.to_dict() for t in self.tasks],
        }
        if self.extras is not None:
            out[self.scheduler] = self.extras
        if self.planned_workers is not None:
            out["planned_workers"] = self.planned_workers
        if self.spares:
            out["spares"] = list(self.spares)
        if self.reshapes:
            out["attempt"] = self.attempt
            out["reshapes"] = [r.to_dict() for r in self.reshapes]
        return out

    def to_json(self) -> str:
        """plan.json's text: one task a line, so a 4,096-task plan is readable and a few hundred kB."""
        data = self.to_dict()
        tasks = data.pop("tasks")
        head = json.dumps(data, indent=2)[:-2]  # without the closing "\n}"
        rows = ",\n".join("    " + json.dumps(t, separators=(", ", ": ")) for t in tasks)
        return f'{head},\n  "tasks": [\n{rows}\n  ]\n}}\n' if rows else f'{head},\n  "tasks": []\n}}\n'

    # --- reading --------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan.json") -> PlanRecord:
        """The record in ``data`` (this version or 1); ``PlanRecordError`` naming the field otherwise. The
        job and run id must be strings ("" when missing: a handle that decides by them refuses), and
        every task listed must be well formed; a missing or damaged optional part gets its default."""
        if not isinstance(data, Mapping):
            raise PlanRecordError(f"{where}: not a plan record (expected a JSON object)")
        version = data.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise PlanRecordError(f"{where}: version: expected 1 to {PLAN_VERSION}, got {str(version)[:20]!r}")
        if version > PLAN_VERSION:
            raise PlanRecordError(
                f"{where}: version {version} was written by a newer tfcluster (this one reads {PLAN_VERSION} "
                "and older): read this run with that version"
            )
        job, run_id = _text(data, "job", where), _text(data, "run_id", where)
        if version == 1:
            tasks, cluster, common = _v1(data, where)
        else:
            rows = data.get("tasks", [])
            if not isinstance(rows, list):
                raise PlanRecordError(f"{where}: tasks: expected a list")
            tasks = tuple(_task(t, f"{where}: tasks[{i}]") for i, t in enumerate(rows))
            cluster = _cluster(data.get("cluster"))
            common = data.get("common") if isinstance(data.get("common"), dict) else {}
        env = common.get("env") if isinstance(common.get("env"), dict) else {}
        scheduler = data.get("scheduler") if isinstance(data.get("scheduler"), str) else "ssh"
        extras = data.get(scheduler)
        return cls(
            job=job,
            run_id=run_id,
            tasks=tasks,
            scheduler=scheduler,
            communication=_opt_text(data.get("communication"), "ring"),
            strategy=_opt_text(data.get("strategy"), "multi_worker_mirrored"),
            roles=data["roles"] if isinstance(data.get("roles"), dict) else None,
            warnings=tuple(w for w in _list(data.get("warnings")) if isinstance(w, str)),
            # an older record has no policy: its step-clock window is the nodes' setting
            policy=StragglerPolicy.from_dict(data.get("policy"), env.get(Env.PROFILE_INTERVAL_S)),
            cluster=cluster,
            common=common,
            extras=extras if isinstance(extras, dict) else None,
            spares=tuple(s for s in _list(data.get("spares")) if isinstance(s, str)),
            planned_workers=_count(data.get("planned_workers")),
            attempt=_count(data.get("attempt")) or 0,
            reshapes=tuple(r for r in map(PlanChange.from_dict, _list(data.get("reshapes"))) if r is not None),
            version=PLAN_VERSION,
        )


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key, "")  # "" where it is missing: a handle that needs it says so
    if not isinstance(value, str):
        raise PlanRecordError(f"{where}: {key}: expected a string, got {str(value)[:40]!r}")
    return value


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _opt_text(value: Any, default: str) -> str:
    return value if isinstance(value, str) else default


def _task(row: Any, where: str) -> TaskRecord:
    if not isinstance(row, Mapping):
        raise PlanRecordError(f"{where}: expected an object")
    name = row.get("task")
    try:
        TaskId.parse(name if isinstance(name, str) else "")
    except ValueError:
        raise PlanRecordError(f"{where}.task: expected a task like worker:0, got {str(name)[:40]!r}") from None
    gpus = row.get("gpus")
    return TaskRecord(
        task=name,
        host=row.get("host") if isinstance(row.get("host"), str) else None,
        gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0 else 0,
        tf_address=row.get("tf_address") if isinstance(row.get("tf_address"), str) else None,
        ssh=row.get("ssh") if isinstance(row.get("ssh"), str) else None,
    )


def _cluster(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, Mapping):
        return {}
    return {k: [e for e in v if isinstance(e, str)] for k, v in value.items() if isinstance(v, list)}


def _v1(data: Mapping[str, Any], where: str) -> tuple[tuple[TaskRecord, ...], dict[str, list[str]], dict[str, Any]]:
    """Version 1: ``nodes``, each with its task, host, TF address, environment and TF_CONFIG."""
    nodes = data.get("nodes", [])
    if not isinstance(nodes, list):
        raise PlanRecordError(f"{where}: nodes: expected a list")
    tasks = []
    for i, n in enumerate(nodes):
        if not isinstance(n, Mapping) or not isinstance(n.get("task"), Mapping):
            raise PlanRecordError(f"{where}: nodes[{i}].task: expected an object with type and index")
        t = n["task"]
        ssh = None
        if isinstance(n.get("ssh_host"), str):
            ssh = f"{n.get('user')}@{n['ssh_host']}:{n.get('ssh_port')}"
        tasks.append(_task({**n, "task": f"{t.get('type')}:{t.get('index')}", "ssh": ssh}, f"{where}: nodes[{i}]"))
    first = nodes[0] if nodes and isinstance(nodes[0], Mapping) else {}
    tf = first.get("tf_config") if isinstance(first.get("tf_config"), Mapping) else {}
    cluster = _cluster(data.get("cluster") if "cluster" in data else tf.get("cluster"))
    env = first.get("env") if isinstance(first.get("env"), Mapping) else {}
    common = {k: first.get(k) for k in ("argv", "shell_line", "command", "workdir", "checkpoint_dir", "backup_dir")}
    common["env"] = {k: v for k, v in env.items() if k not in _OWN_ENV}
    if isinstance(first.get("remote_dir"), str):  # each task's was TASK_ROOT/<type>-<index>
        common["task_root"] = first["remote_dir"].rpartition("/")[0]
    return tuple(tasks), cluster, common
