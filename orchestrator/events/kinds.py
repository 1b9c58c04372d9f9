"""Every event kind, one frozen dataclass each, in the order of docs/events.md (which lists their fields):
the job's and the tasks' here, the verdicts in ``verdicts``, how a run goes on and ends in ``outcomes``.

Fields are declared in the order of their events.jsonl line. A field without a default must be given
when the event is built; reading a line, a missing field whose type allows null reads as null (see
``base``). Structured values stay JSON-shaped (``root_cause``: a ``core.result.Failure`` dict;
``findings``: diagnostics; ``gpus``; per-task ``steps`` maps) with their outer type checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from worker_entry.protocol import spec
from worker_entry.protocol.metrics import METRICS_MAX

from .base import COUNT, MANY, TEXT, BaseEvent, gpu_models
from .defences import DEFENCES
from .defences import ConnectionRefused as ConnectionRefused
from .defences import LogCut as LogCut
from .defences import NodeProtocolError as NodeProtocolError
from .defences import PodIgnored as PodIgnored
from .outcomes import (
    AttemptFinished,
    BackupCopied,
    GatherFailed,
    GatherFinished,
    GatherStarted,
    JobFinished,
    Requeued,
    Reshaped,
    Restart,
    RoleFailure,
    SlurmAllocation,
    TrainingCompleted,
    TrainingEnded,
)
from .verdicts import (
    CheckFinding,
    GpuProblemFound,
    JobStalled,
    StartupTimeout,
    Straggler,
    StragglerCleared,
    WorkerHung,
    WorkerLost,
    WorkerSlowing,
)

# --- the job ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class JobStarted(BaseEvent):
    """The launcher starts: the first event of a run."""

    KIND: ClassVar[str] = "job_started"
    job: str
    run_id: str
    run_dir: str
    tasks: int = field(metadata=COUNT)
    attempt_limit: int | None = field(metadata=spec(lo=1))  # null: a Slurm submission refused by sbatch


@dataclass(frozen=True, kw_only=True)
class MetricsServed(BaseEvent):
    """The launcher serves Prometheus metrics."""

    KIND: ClassVar[str] = "metrics"
    url: str


@dataclass(frozen=True, kw_only=True)
class JobWarning(BaseEvent):
    """A spec warning, a completed log, a backup copied before a restart."""

    KIND: ClassVar[str] = "warning"
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class Connected(BaseEvent):
    """Every host is reachable."""

    KIND: ClassVar[str] = "connected"
    hosts: int = field(metadata=COUNT)
    seconds: float = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class ConnectFailed(BaseEvent):
    """A host cannot be reached (one per host); ``kind`` is the diagnostic's code."""

    KIND: ClassVar[str] = "connect_failed"
    kind: str
    message: str = field(metadata=TEXT)
    hint: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class AttemptStarted(BaseEvent):
    """An attempt (0, then one per restart) starts its tasks."""

    KIND: ClassVar[str] = "attempt_started"
    attempt: int = field(metadata=COUNT)


# --- a task -----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskReady(BaseEvent):
    """worker_entry reported its facts; ``gpus``: per GPU ``name`` and ``memory_mb``; ``cpus``, ``machine``: its
    host's CPU count and kernel boot id (`predict` tells which workers share cores by them)."""

    KIND: ClassVar[str] = "task_ready"
    hostname: str
    pid: int = field(metadata=spec(lo=1))
    gpus: list[dict[str, Any]] = field(metadata={**MANY, "repair": gpu_models})
    # the host's CPU count and its kernel's boot id (hello facts): which tasks share one machine's cores
    cpus: int | None = field(default=None, metadata=COUNT)
    machine: str | None = field(default=None, metadata=spec(max_len=64))


@dataclass(frozen=True, kw_only=True)
class Preflight(BaseEvent):
    """Cross-host checks ran, before the go; ``findings``: the failed checks as diagnostics."""

    KIND: ClassVar[str] = "preflight"
    ok: bool
    summary: str = field(metadata=TEXT)
    findings: list[dict[str, Any]] = field(metadata=MANY)
    warnings: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class HeterogeneousGpus(BaseEvent):
    """Different GPU models across hosts."""

    KIND: ClassVar[str] = "heterogeneous_gpus"
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class ShellNoise(BaseEvent):
    """The login shell printed something before worker_entry (kept in the task's log)."""

    KIND: ClassVar[str] = "shell_noise"
    text: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class TaskSpawned(BaseEvent):
    """The training command runs."""

    KIND: ClassVar[str] = "task_spawned"
    pid: int = field(metadata=spec(lo=1))


@dataclass(frozen=True, kw_only=True)
class TaskStarted(BaseEvent):
    """The task has started; ``how``: ``tf_server``, ``strategy`` or ``progress``."""

    KIND: ClassVar[str] = "task_started"
    how: str


@dataclass(frozen=True, kw_only=True)
class Evaluation(BaseEvent):
    """An evaluator task evaluated (``model.evaluate``, e.g. ``SidecarEvaluator``'s per checkpoint): the
    metrics as it reported them, the checkpoint and its training step when known (``evaluations``
    folds them: live for status, from events.jsonl for ``report``)."""

    KIND: ClassVar[str] = "evaluation"
    count: int = field(metadata=spec(lo=1))
    metrics: dict[str, float] = field(metadata=spec(max_len=METRICS_MAX))
    step: int | None = field(metadata=COUNT)
    checkpoint: str | None
    source: str
    dropped: int = field(default=0, metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class ScriptHint(BaseEvent):
    """The instrumentation recognised a known mistake in the script as it failed (``supervise.hints``
    words it; the task's failure carries it as its fix): the first task to report each mistake."""

    KIND: ClassVar[str] = "hint"
    code: str
    message: str = field(metadata=TEXT)
    file: str | None = None
    line: int | None = field(default=None, metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class TaskExited(BaseEvent):
    """A task ended, or the launcher stopped waiting for it: every field always there, null when unknown
    (``code`` null: past the teardown deadline, silent, or its channel closed during the teardown)."""

    KIND: ClassVar[str] = "task_exited"
    code: int | None
    signal: int | None = field(metadata=spec(lo=1))
    signal_name: str | None
    stopped: bool  # ended by our teardown
    reason: str | None = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class TaskLost(BaseEvent):
    """The channel closed without an exit status; ``status``: the channel's own, when it has one."""

    KIND: ClassVar[str] = "task_lost"
    message: str = field(metadata=TEXT)
    status: int | None


@dataclass(frozen=True, kw_only=True)
class ExitUnconfirmed(BaseEvent):
    """A host did not confirm that the task's processes and its worker_entry are gone when the
    attempt ended (its link died, or its worker_entry did not exit in time): something may still run."""

    KIND: ClassVar[str] = "exit_unconfirmed"
    message: str = field(metadata=TEXT)


# --- stopping ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Interrupted(BaseEvent):
    """SIGINT/SIGTERM on the launcher (or ``tfcluster stop``); ``signal``: its name."""

    KIND: ClassVar[str] = "interrupted"
    signal: str


@dataclass(frozen=True, kw_only=True)
class Detached(BaseEvent):
    """SIGHUP: the job goes on, the launcher's output goes to ``log``."""

    KIND: ClassVar[str] = "detached"
    message: str = field(metadata=TEXT)
    log: str


@dataclass(frozen=True, kw_only=True)
class BoundReached(BaseEvent):
    """A bounded run had its steps or time; ``steps``: the fewest any running worker made."""

    KIND: ClassVar[str] = "bound_reached"
    message: str = field(metadata=TEXT)
    steps: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class Teardown(BaseEvent):
    """The whole job is being stopped (``bounded``: a bounded run had enough)."""

    KIND: ClassVar[str] = "teardown"
    reason: str = field(metadata=TEXT)
    grace_s: float = field(metadata=COUNT)
    bounded: bool = False


#: Every kind, by its name (docs/events.md lists each with its fields).
EVENT_TYPES: dict[str, type[BaseEvent]] = {
    cls.KIND: cls
    for cls in (
        JobStarted,
        MetricsServed,
        JobWarning,
        Connected,
        ConnectFailed,
        AttemptStarted,
        TaskReady,
        Preflight,
        HeterogeneousGpus,
        ShellNoise,
        TaskSpawned,
        TaskStarted,
        Evaluation,
        ScriptHint,
        TaskExited,
        TaskLost,
        ExitUnconfirmed,
        WorkerLost,
        WorkerHung,
        JobStalled,
        StartupTimeout,
        Straggler,
        StragglerCleared,
        WorkerSlowing,
        GpuProblemFound,
        Interrupted,
        Detached,
        BoundReached,
        Teardown,
        AttemptFinished,
        TrainingCompleted,
        RoleFailure,
        TrainingEnded,
        Restart,
        Reshaped,
        BackupCopied,
        GatherStarted,
        GatherFinished,
        GatherFailed,
        JobFinished,
        SlurmAllocation,
        Requeued,
        CheckFinding,
        *DEFENCES,
    )
}
EVENT_KINDS = frozenset(EVENT_TYPES)
