"""``scheduler: slurm`` in the spec: its ``slurm:`` section, its rules and where its jobs give roles."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from ...spec.model import Count, GpuCount, Role, SpecModel, TensorflowSpec, matches
from ...spec.roles import raw_roles
from ...spec.sections import Add, RoleHolders, SchedulerSection

#: Slurm's time formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; or UNLIMITED/INFINITE.
SLURM_TIME_RE = re.compile(  # ASCII digits: \d took Arabic-Indic digits, which Slurm does not read
    r"^(?:[0-9]+(?::[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|UNLIMITED|INFINITE)$"
)
#: A Slurm name (partition, account, qos): letters, digits and ._- only.
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: sbatch options tfcluster sets itself (or that have their own field): not allowed in extra_args.
SLURM_RESERVED_OPTIONS = frozenset(
    {
        "nodes",
        "ntasks",
        "ntasks-per-node",
        "gpus",
        "gpus-per-node",
        "gres",
        "signal",
        "requeue",
        "no-requeue",
        "job-name",
        "output",
        "error",
        "input",
        "partition",
        "account",
        "qos",
        "time",
        "constraint",
        "exclusive",
        "wrap",
        "chdir",
        "export",
        "array",
        "dependency",
        "kill-on-bad-exit",
        "comment",
        "open-mode",
        "parsable",
    }
)
#: Tasks of one job at most (the plan record and the supervisor are measured to 16,384; 4x that still plans)
MAX_TASKS = 65_536
SLURM_OPTION_RE = re.compile(r"^--([a-z][a-z0-9-]*)(?:=([^\x00-\x1f\x7f]*))?$")


def _slurm_option(value: str) -> str:
    m = SLURM_OPTION_RE.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} is not an sbatch long option (--name or --name=value, no control characters)")
    name = m.group(1)
    # sbatch's getopt_long takes any unique prefix of a long option: --outp= is --output=
    hit = next((r for r in sorted(SLURM_RESERVED_OPTIONS) if r == name or r.startswith(name)), None)
    if hit is not None:
        what = f"--{name}" if hit == name else f"--{name} (sbatch reads it as --{hit})"
        raise ValueError(f"{what} is set by tfcluster (or by its own field in slurm:); remove it here")
    return value


def _time_is_text(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f'read as the number {value:g}: quote the time (time: "10:00"); YAML reads unquoted 10:00 as a '
            "base-60 number (600), and Slurm reads a bare number as minutes"
        )
    return value


SlurmName = Annotated[str, Field(strict=True), matches(SLURM_NAME_RE, "a Slurm name (letters, digits, '._-')")]
SlurmTime = Annotated[
    str,
    BeforeValidator(_time_is_text),
    Field(strict=True),
    matches(SLURM_TIME_RE, "a Slurm time (minutes, H:M:S, D-H:M:S or UNLIMITED)"),
]
SlurmOption = Annotated[str, Field(strict=True), AfterValidator(_slurm_option)]


class SlurmSpec(SpecModel):
    """Run under Slurm: `sbatch` from a login node, or one `srun` step inside an allocation."""

    nodes: Count = Field(description="Nodes to allocate (sbatch --nodes).")
    tasks_per_node: Count = Field(1, description="MWMS tasks per node (each one worker_entry and one TF server).")
    gpus_per_node: GpuCount = Field(0, description="GPUs per node (--gpus-per-node); split evenly among its tasks.")
    partition: SlurmName | None = Field(None, description="sbatch --partition.")
    account: SlurmName | None = Field(None, description="sbatch --account.")
    qos: SlurmName | None = Field(None, description="sbatch --qos.")
    time: SlurmTime | None = Field(None, description="Time limit (sbatch --time): minutes, H:M:S, D-H:M:S.")
    constraint: (
        Annotated[str, Field(strict=True, min_length=1, max_length=1024, pattern=r"^[^\s\x00-\x1f]+$")] | None
    ) = Field(None, description="sbatch --constraint (node features).")
    exclusive: bool = Field(False, description="sbatch --exclusive: no other job shares the nodes.")
    extra_args: list[SlurmOption] = Field(
        default_factory=list,
        description="More sbatch/srun long options (--mem=64G, --reservation=x); options tfcluster sets are refused.",
    )
    requeue: bool = Field(
        True, description="Requeue the job after a preemption or time limit (resume from the backup)."
    )
    signal_lead_s: Annotated[int, Field(strict=True, ge=0, le=65535)] = Field(
        120,
        description="Seconds before the time limit (or on preemption) that SIGUSR2 asks the job to save (--signal).",
    )
    max_requeues: Annotated[int, Field(strict=True, ge=0, le=1000)] = Field(
        10, description="At most this many requeues after preemptions, and this many after time limits."
    )
    spare_nodes: Annotated[int, Field(strict=True, ge=0, le=100_000)] = Field(
        0,
        description="Nodes the allocation holds beyond slurm.nodes, to replace a node lost for good in the next "
        "attempt (restart.min_workers: the fewest workers to go on with when none is left).",
    )
    roles: dict[Role, Annotated[int, Field(strict=True, ge=0, le=65536)]] | None = Field(
        None,
        description="Tasks of the job by role (chief, worker, ps, evaluator), e.g. {chief: 1, worker: 6, ps: 1}: "
        "as many as nodes x tasks_per_node, placed in that order (block distribution). Default: tensorflow.chief "
        "and workers. Which roles a strategy allows: tensorflow.strategy.",
    )


def _rules(data: dict[str, Any], add: Add) -> None:
    """GPUs split evenly among a node's tasks; with roles, the roles fill the step exactly."""
    slurm = data.get("slurm") if isinstance(data.get("slurm"), dict) else {}
    gpus, per_node = slurm.get("gpus_per_node", 0), slurm.get("tasks_per_node", 1)
    if isinstance(gpus, int) and isinstance(per_node, int) and per_node > 0 and gpus % per_node:
        add(
            ("slurm", "gpus_per_node"),
            f"{gpus} GPUs per node do not split evenly among {per_node} tasks per node; MWMS needs the same "
            "number of GPUs on every task",
        )
    min_workers = (data.get("restart") if isinstance(data.get("restart"), dict) else {}).get("min_workers")
    if isinstance(min_workers, int) and not isinstance(min_workers, bool) and min_workers > 0 and slurm.get("roles"):
        add(
            ("restart", "min_workers"),
            "not used by this job: slurm.roles fill the step exactly, so a node lost for good is replaced by a "
            "spare node (slurm.spare_nodes) or the run ends; it never goes on with fewer nodes",
            "warning",
        )
    tf = data.get("tensorflow") if isinstance(data.get("tensorflow"), dict) else {}
    port = tf.get("port", TensorflowSpec.model_fields["port"].default)
    if type(port) is int and type(per_node) is int and port > 0 and port + per_node - 1 > 65535:
        add(  # a node's tasks take port, port + 1, ...: past 65535 it was found only inside the allocation
            ("slurm", "tasks_per_node"),
            f"{per_node} tasks per node take TF ports {port}..{port + per_node - 1}, past 65535: lower "
            "tensorflow.port or the tasks per node",
        )
    roles = slurm.get("roles")
    nodes = slurm.get("nodes")
    if type(nodes) is int and type(per_node) is int and nodes * per_node > MAX_TASKS:
        add(  # (each field alone was in range: 10^5 x 10^5 tasks ran the planner out of memory)
            ("slurm", "tasks_per_node"),
            f"slurm.nodes x slurm.tasks_per_node = {nodes} x {per_node} = {nodes * per_node} tasks; tfcluster "
            f"plans at most {MAX_TASKS:,}",
        )
        return
    clean = isinstance(roles, dict) and roles == raw_roles({"roles": roles}, 0, False)  # the fields say the rest
    if clean and isinstance(nodes, int) and isinstance(per_node, int) and nodes > 0 < per_node:
        n = sum(roles.values())
        if n and nodes * per_node != n:
            add(
                ("slurm", "roles"),
                f"{n} tasks by role, but slurm.nodes x slurm.tasks_per_node = {nodes} x {per_node} = "
                f"{nodes * per_node} task slots: make them equal (Slurm places the tasks in rank order: chief, "
                "workers, ps, evaluator)",
            )


def planned_workers(data: dict[str, Any]) -> int | None:
    """The job's training tasks (chief and workers): slurm.nodes x tasks_per_node, or its roles'."""
    slurm = data.get("slurm") if isinstance(data.get("slurm"), dict) else {}
    roles, nodes, per_node = slurm.get("roles"), slurm.get("nodes"), slurm.get("tasks_per_node", 1)
    if isinstance(roles, dict):
        clean = raw_roles({"roles": roles}, 0, False)
        return clean.get("chief", 0) + clean.get("worker", 0)
    if isinstance(nodes, int) and isinstance(per_node, int) and not isinstance(nodes, bool) and nodes > 0 < per_node:
        return nodes * per_node
    return None


def _roles(data: dict[str, Any]) -> RoleHolders | None:
    section = data.get("slurm")
    if not isinstance(section, dict):
        return None
    return RoleHolders(
        holders=[(("slurm", "roles"), "slurm.roles", section.get("roles"))],
        given=[0] if section.get("roles") is not None else [],
        field="slurm.roles",
        example="slurm.roles: {chief: 1, worker: 2, ps: 1}",
    )


SECTION = SchedulerSection(
    name="slurm",
    key="slurm",
    fields={
        "slurm": (SlurmSpec | None, Field(None, description="scheduler slurm: the allocation and how to run in it."))
    },
    needs="a slurm: section (at least nodes)",
    package="orchestrator.schedulers.slurm.scheduler",
    rules=_rules,
    roles=_roles,
    workers=planned_workers,
    reshapes=True,
)
