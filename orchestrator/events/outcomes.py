"""The events of how a run goes on and ends: an attempt finished, the run restarts (or a role's task
alone), the training ended or completed, the gather, the last event; and the Slurm allocations a run
spans (split from ``kinds``, which registers them with the rest in docs/events.md's order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import COUNT, MANY, TEXT, BaseEvent, failure_or_none

# --- attempts, gathering, the end ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttemptFinished(BaseEvent):
    """Every task of an attempt ended; ``root_cause``: a failure record, or null."""

    KIND: ClassVar[str] = "attempt_finished"
    attempt: int = field(metadata=COUNT)
    state: str
    root_cause: dict[str, Any] | None = field(metadata={"repair": failure_or_none})


@dataclass(frozen=True, kw_only=True)
class TrainingCompleted(BaseEvent):
    """Every task completed its training (exit 0) although a signal came meanwhile, or already did in an
    earlier allocation: the run is done, not interrupted, requeued or started over."""

    KIND: ClassVar[str] = "training_completed"
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class RoleFailure(BaseEvent):
    """A task whose role does not take the job down failed (``action`` restart: a parameter-server
    worker started again alone, in place, ``restarts`` times so far; report: a sidecar evaluator, the
    training goes on without it). ``kind``: the failure's kind (exit, signal, lost, hung, ...)."""

    KIND: ClassVar[str] = "role_failure"
    role: str
    kind: str
    action: str
    restarts: int = field(metadata=COUNT)
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class TrainingEnded(BaseEvent):
    """The tasks that train have all exited 0 (MWMS: chief and workers; parameter_server: the chief);
    the others, which never end by themselves (ps, workers of a parameter-server job, the evaluator),
    are stopped now, and the attempt counts as succeeded. ``stopping``: how many."""

    KIND: ClassVar[str] = "training_ended"
    message: str = field(metadata=TEXT)
    stopping: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class Restart(BaseEvent):
    """All tasks are relaunched after a failure."""

    KIND: ClassVar[str] = "restart"
    attempt: int = field(metadata=COUNT)
    max_attempts: int = field(metadata=COUNT)
    reason: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class Reshaped(BaseEvent):
    """A host lost for good leaves the run (``host``, the task it ran: ``task``): the next attempt runs on
    a new plan, with a spare in its place or one worker fewer (issue 34)."""

    KIND: ClassVar[str] = "reshaped"
    attempt: int = field(metadata=COUNT)  # the attempt that runs on the new plan
    reason: str = field(metadata=TEXT)
    spare_in: str | None = field(default=None, metadata=TEXT)
    workers_before: int = field(metadata=COUNT)
    workers_after: int = field(metadata=COUNT)
    spares_left: int = field(metadata=COUNT)
    lost_ts: float = field(metadata=COUNT)  # when the host failed: "the loss to training again" starts here


@dataclass(frozen=True, kw_only=True)
class BackupCopied(BaseEvent):
    """A new save of the chief's backup was copied off its host into ``copy`` (RUN/backup/copy-N), whole
    and verified: the next attempt can resume from it even if that host is gone. ``fetched`` files
    crossed the network, the rest were unchanged; ``save_s``: the chief's writing of the save, from its
    first to its last changed file (a floor); ``copy_s``: the copy's own time."""

    KIND: ClassVar[str] = "backup_copied"
    attempt: int = field(metadata=COUNT)
    copy: str
    files: int = field(metadata=COUNT)
    bytes: int = field(metadata=COUNT)
    fetched: int = field(metadata=COUNT)
    save_s: float
    copy_s: float


@dataclass(frozen=True, kw_only=True)
class GatherStarted(BaseEvent):
    """Copying logs and checkpoints back begins, for ``attempts`` attempts."""

    KIND: ClassVar[str] = "gather_started"
    attempts: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class GatherFinished(BaseEvent):
    """Copying back ended; ``skipped`` and ``errors`` are counts."""

    KIND: ClassVar[str] = "gather_finished"
    files: int = field(metadata=COUNT)
    bytes: int = field(metadata=COUNT)
    dest: str
    already_verified: int = field(metadata=COUNT)
    skipped: int = field(metadata=COUNT)
    errors: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class GatherFailed(BaseEvent):
    """Some files could not be copied back; ``errors``: every one, ``message``: the first three."""

    KIND: ClassVar[str] = "gather_failed"
    message: str = field(metadata=TEXT)
    errors: list[str] = field(metadata=MANY)


@dataclass(frozen=True, kw_only=True)
class JobFinished(BaseEvent):
    """The last event of a run."""

    KIND: ClassVar[str] = "job_finished"
    state: str
    wall_time_s: float
    run_dir: str
    root_cause: dict[str, Any] | None = field(metadata={"repair": failure_or_none})


# --- Slurm ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SlurmAllocation(BaseEvent):
    """A supervisor starts in a Slurm allocation (the first, or one after a requeue)."""

    KIND: ClassVar[str] = "slurm_allocation"
    job_id: str
    restart: int = field(metadata=COUNT)
    nodes: str = field(metadata=TEXT)
    batch_host: str | None
    first_attempt: int = field(metadata=COUNT)
    preemptions: int = field(metadata=COUNT)
    timeouts: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class Requeued(BaseEvent):
    """The allocation ended (time limit near, preemption); the next allocation resumes."""

    KIND: ClassVar[str] = "requeued"
    reason: str
    job_id: str
    how: str
    preemptions: int = field(metadata=COUNT)
    timeouts: int = field(metadata=COUNT)
    next_attempt: int = field(metadata=COUNT)
