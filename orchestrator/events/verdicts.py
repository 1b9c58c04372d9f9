"""The verdict events: what the supervisor concluded about a worker or the job (split from ``kinds``,
which registers them with the rest in docs/events.md's order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from worker_entry.protocol import spec

from .base import COUNT, MANY, SOMETIMES, TEXT, BaseEvent

# --- verdicts ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WorkerLost(BaseEvent):
    """No heartbeat for ``heartbeat.timeout_s`` (``suspect``: silent before a peer failed)."""

    KIND: ClassVar[str] = "worker_lost"
    message: str = field(metadata=TEXT)
    silent_s: float = field(metadata=COUNT)
    suspect: bool = field(default=False, metadata=SOMETIMES)


@dataclass(frozen=True, kw_only=True)
class WorkerHung(BaseEvent):
    """The training process is stopped (``state``, ``stopped_s``), or makes no progress while others do
    (``steps``); ``suspect``: stopped before a peer failed. Only the fields that apply are written."""

    KIND: ClassVar[str] = "worker_hung"
    message: str = field(metadata=TEXT)
    state: str | None = field(default=None, metadata=SOMETIMES)
    stopped_s: float | None = field(default=None, metadata={**COUNT, **SOMETIMES})
    steps: int | None = field(default=None, metadata={**COUNT, **SOMETIMES})
    suspect: bool = field(default=False, metadata=SOMETIMES)


@dataclass(frozen=True, kw_only=True)
class JobStalled(BaseEvent):
    """No training step on any worker for ``heartbeat.progress_timeout_s``; ``steps`` per task."""

    KIND: ClassVar[str] = "job_stalled"
    message: str = field(metadata=TEXT)
    steps: dict[str, int | None] = field(metadata=MANY)


@dataclass(frozen=True, kw_only=True)
class StartupTimeout(BaseEvent):
    """Tasks did not start within ``job.startup_timeout_s``."""

    KIND: ClassVar[str] = "startup_timeout"
    message: str = field(metadata=TEXT)
    not_started: list[str] = field(metadata=MANY)


@dataclass(frozen=True, kw_only=True)
class Straggler(BaseEvent):
    """A worker the others wait for, confirmed over two profile rounds; ``pre_collective_ms`` per task."""

    KIND: ClassVar[str] = "straggler"
    message: str = field(metadata=TEXT)
    wait_ms: float = field(metadata=COUNT)
    step_ms: float = field(metadata=COUNT)
    share: float = field(metadata=COUNT)
    cause: str
    pre_collective_ms: dict[str, float] = field(metadata=MANY)
    relative_score: float | None = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class StragglerCleared(BaseEvent):
    """The straggler no longer is one."""

    KIND: ClassVar[str] = "straggler_cleared"
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class WorkerSlowing(BaseEvent):
    """A worker's own work per step fell well below its best window, two rounds in a row."""

    KIND: ClassVar[str] = "worker_slowing"
    message: str = field(metadata=TEXT)
    individual_score: float = field(metadata=COUNT)
    relative_score: float = field(metadata=COUNT)
    local_ms: float = field(metadata=COUNT)
    best_local_ms: float | None = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class GpuProblemFound(BaseEvent):
    """One GPU of a task has a problem (``supervise.gpus``): a fault, another program on it, a power limit
    below the board's, or it is slower than its same-model peers; once per GPU and problem while it lasts."""

    KIND: ClassVar[str] = "gpu_problem"
    message: str = field(metadata=TEXT)
    gpu: int = field(metadata=spec(lo=0, hi=1024))
    problem: str
    model: str | None
    reading: dict[str, Any] = field(metadata=MANY)


@dataclass(frozen=True, kw_only=True)
class CheckFinding(BaseEvent):
    """`launch --check` named something before the job starts (``job.checkjudge``): ``code`` ``slow_host``,
    ``slow_gpu``, ``slow_link`` or ``no_result``; ``figure`` against the ``median`` (GFLOP/s or bytes/s)."""

    KIND: ClassVar[str] = "check_finding"
    message: str = field(metadata=TEXT)
    code: str
    subject: str
    figure: float | None = field(metadata=COUNT)
    median: float | None = field(metadata=COUNT)
