"""Failures are data: what happened to each task and the job; the first failure is the root cause."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .diagnostics import Diagnostic
from .states import JobState, TaskState, advance

#: Failure.kind values (docs/events.md): what kind of thing went wrong.
FAILURE_KINDS = frozenset(
    {
        "exit",  # non-zero exit of the training command
        "signal",  # killed by a signal it did not get from us
        "lost",  # connection closed without an exit status, or silent past the heartbeat timeout
        "hung",  # stopped (SIGSTOP) or no progress while others progress
        "stalled",  # no progress anywhere
        "startup_timeout",  # not started in time (MWMS would wait forever)
        "straggler",  # a confirmed straggler, with heartbeat.kill_stragglers
        "spawn",  # worker_entry could not be started
        "agent",  # worker_entry itself raised on a reachable host (a tfcluster bug): not the host's failure
        "restart",  # a task could not be started again in place (its TF_CONFIG cannot be rebuilt)
        "protocol",  # the node sent something the protocol does not allow
        "connect",  # a host could not be reached
        "preflight",  # hosts unfit to run the job
        "scheduler",  # the scheduler refused, preempted or timed out the job (Slurm: sbatch, requeues, scancel)
    }
)


@dataclass(frozen=True)
class Failure:
    """One thing that went wrong, attributed to a task where possible."""

    kind: str
    message: str
    ts: float
    task: str | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    attempt: int = 0
    last_lines: tuple[str, ...] = ()
    hint: str = ""

    def __post_init__(self) -> None:
        assert self.kind in FAILURE_KINDS, self.kind

    @property
    def diagnostic(self) -> Diagnostic:
        return Diagnostic(self.message, self.hint, task=self.task, host=self.host, code=self.kind)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["last_lines"] = list(self.last_lines)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Failure:
        """Back from ``to_dict`` (a run directory written by an earlier launcher); TypeError/ValueError if not."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known["last_lines"] = tuple(str(x) for x in d.get("last_lines") or ())[-50:]
        if d.get("kind") not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {d.get('kind')!r}")
        return cls(**known)


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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskResult:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known["state"] = TaskState(d.get("state", "pending"))
        return cls(**known)


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

    def become(self, new: JobState) -> None:
        """The policy's reading of the attempt (requeued, or completed after all): through the one table."""
        self.state = advance(self.state, new)

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptResult:
        """Back from ``to_dict``: attempts of earlier allocations of a requeued job."""
        return cls(
            attempt=int(d["attempt"]),
            state=JobState(d["state"]),
            started_ts=float(d["started_ts"]),
            ended_ts=float(d["ended_ts"]),
            tasks={str(k): TaskResult.from_dict(v) for k, v in (d.get("tasks") or {}).items()},
            failures=[Failure.from_dict(f) for f in d.get("failures") or []],
        )


@dataclass
class RunResult:
    job: str
    run_id: str
    run_dir: str
    state: JobState
    started_ts: float
    ended_ts: float
    attempts: list[AttemptResult] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)  # failures outside attempts (connect)
    gather: dict[str, Any] | None = None
    gather_error: str | None = None
    gather_interrupted: int | None = None  # the signal that stopped the gather (it resumes later)

    def become(self, new: JobState) -> None:
        """Every change of the run's state goes through the one table (``states.advance``)."""
        self.state = advance(self.state, new)

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
            "state": self.state.value,
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
            "gather_interrupted": self.gather_interrupted,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """Back from result.json (a run followed from a Slurm login node); KeyError/TypeError/ValueError
        if it is not one."""
        attempts = [AttemptResult.from_dict(a) for a in d.get("attempts") or []]
        return cls(
            job=str(d.get("job") or ""),
            run_id=str(d.get("run_id") or ""),
            run_dir=str(d.get("run_dir") or ""),
            state=JobState(d["state"]),
            started_ts=float(d.get("started_ts") or 0.0),
            ended_ts=float(d.get("ended_ts") or 0.0),
            attempts=attempts,
            failures=[Failure.from_dict(f) for f in d.get("failures") or []],
            gather=d.get("gather") if isinstance(d.get("gather"), dict) else None,
            gather_error=d.get("gather_error") if isinstance(d.get("gather_error"), str) else None,
            gather_interrupted=d.get("gather_interrupted") if isinstance(d.get("gather_interrupted"), int) else None,
        )
