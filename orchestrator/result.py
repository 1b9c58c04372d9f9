"""Failures are data: what happened to each task and the job, with the first failure as root cause."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class TaskState(str, enum.Enum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # worker_entry exec'd, waiting for its hello
    READY = "ready"  # hello received, waiting for go
    RUNNING = "running"  # the training command runs
    STOPPING = "stopping"  # asked to stop
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # non-zero exit or signal of its own
    STOPPED = "stopped"  # ended by our teardown
    LOST = "lost"  # no exit status: connection or host gone
    NOT_STARTED = "not_started"  # never ran (preflight refused, or teardown before go)

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_TASK

    @property
    def is_alive(self) -> bool:
        return self in (TaskState.STARTING, TaskState.READY, TaskState.RUNNING, TaskState.STOPPING)


_TERMINAL_TASK = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST, TaskState.NOT_STARTED}
)


class JobState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREFLIGHT_FAILED = "preflight_failed"
    INTERRUPTED_SIGINT = "interrupted_sigint"
    INTERRUPTED_SIGTERM = "interrupted_sigterm"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.STARTING, JobState.RUNNING, JobState.STOPPING, JobState.RESTARTING)


@dataclass(frozen=True)
class Failure:
    """One thing that went wrong, attributed to a task where possible."""

    kind: str  # exit | signal | lost | hung | stalled | startup_timeout | straggler | spawn | connect | preflight | interrupted
    message: str
    ts: float
    task: str | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    attempt: int = 0
    last_lines: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["last_lines"] = list(self.last_lines)
        return d


@dataclass
class TaskResult:
    task: str
    host: str
    state: TaskState = TaskState.PENDING
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    started: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d


@dataclass
class AttemptResult:
    attempt: int
    state: JobState
    started_ts: float
    ended_ts: float
    tasks: dict[str, TaskResult]
    failures: list[Failure] = field(default_factory=list)

    @property
    def root_cause(self) -> Failure | None:
        return self.failures[0] if self.failures else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "state": self.state.value,
            "started_ts": self.started_ts,
            "ended_ts": self.ended_ts,
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "failures": [f.to_dict() for f in self.failures],
            "tasks": {k: v.to_dict() for k, v in self.tasks.items()},
        }


@dataclass
class RunResult:
    job: str
    run_id: str
    run_dir: str
    state: str
    started_ts: float
    ended_ts: float
    attempts: list[AttemptResult] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)  # failures outside attempts (connect, preflight)
    gather: dict[str, Any] | None = None
    gather_error: str | None = None

    @property
    def root_cause(self) -> Failure | None:
        if self.failures:
            return self.failures[0]
        for a in reversed(self.attempts):
            if a.root_cause:
                return a.root_cause
        return None

    @property
    def tasks(self) -> dict[str, TaskResult]:
        return self.attempts[-1].tasks if self.attempts else {}

    def to_dict(self) -> dict[str, Any]:
        rc = self.root_cause
        return {
            "job": self.job,
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "state": self.state,
            "started_ts": self.started_ts,
            "ended_ts": self.ended_ts,
            "wall_time_s": round(self.ended_ts - self.started_ts, 3),
            "root_cause": rc.to_dict() if rc else None,
            "tasks": {k: v.to_dict() for k, v in self.tasks.items()},
            "attempts": [a.to_dict() for a in self.attempts],
            "restarts": max(0, len(self.attempts) - 1),
            "failures": [f.to_dict() for f in self.failures],
            "gather": self.gather,
            "gather_error": self.gather_error,
        }
