"""The report of one run as one typed model: what ``report`` builds once from the run directory, and
what its text, its HTML page and pictures, ``scale`` and (through ``scale``) ``predict`` read.

Why a model and not a dict: every reader used to pick apart the same ~25 keys by name, each with its
own defaults for a missing one. Here each part says what it holds; ``to_dict()`` is the one place the
``report --json`` shape is written (its keys are a contract: scripts and the README read them).

The per-task training figures are ``supervise.figures.TaskFigures`` — the one owner `status` shows
too (its rows are read back into the same type: ``TaskFigures.from_dict``), so a finished run's
`status` and `report` show the same figures from the same arithmetic. The parts computed by their own
modules are typed there and built once by them: ``split.JobSplit``, ``pace.Pace``,
``goodputmodel.Goodput``, ``lossmodel.LossCurve`` and ``lossmodel.NoiseScale``; views read them by
attribute (tests/test_architecture.py refuses ``rep.goodput["..."]``), and each writes its own part of
``report --json`` (``to_dict``) in the shape it always had (tests/test_report_json_shape.py pins it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..events.kinds import RoleFailure, Straggler, TrainingEnded, WorkerSlowing
from ..supervise.figures import TaskFigures
from .goodputmodel import Goodput
from .lossmodel import LossCurve, NoiseScale
from .pace import Pace
from .split import JobSplit

#: A host's evidence, the medians of its heartbeats' samples (``supervise.hoststats``' names).
HOST_KEYS = ("wait_pct", "throttled_pct", "steal_pct", "tcp_retrans_pct")


@dataclass(frozen=True)
class Window:
    """``--last``: only the samples of the run's last ``last_s`` seconds (from_ts .. to_ts)."""

    last_s: float
    from_ts: float
    to_ts: float

    def to_dict(self) -> dict[str, Any]:
        return {"last_s": self.last_s, "from_ts": self.from_ts, "to_ts": self.to_ts}


@dataclass(frozen=True)
class StragglerNote:
    """A straggler the launcher named live (a ``straggler`` event)."""

    ts: float
    task: str | None
    host: str | None
    wait_ms: float | None
    share: float | None
    cause: str | None
    message: str

    @classmethod
    def of(cls, ev: Straggler) -> StragglerNote:
        return cls(ev.ts, ev.task, ev.host, ev.wait_ms, ev.share, ev.cause, ev.message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "task": self.task,
            "host": self.host,
            "wait_ms": self.wait_ms,
            "share": self.share,
            "cause": self.cause,
            "message": self.message,
        }


@dataclass(frozen=True)
class SlowingNote:
    """A worker slower than its own earlier steps (a ``worker_slowing`` event)."""

    ts: float
    task: str | None
    host: str | None
    message: str

    @classmethod
    def of(cls, ev: WorkerSlowing) -> SlowingNote:
        return cls(ev.ts, ev.task, ev.host, ev.message)

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "task": self.task, "host": self.host, "message": self.message}


@dataclass(frozen=True)
class RoleNote:
    """What happened to a role that does not take the job down, or the training's end (no task)."""

    ts: float
    message: str
    task: str | None = None
    host: str | None = None
    role: str | None = None
    action: str | None = None
    restarts: int | None = None

    @classmethod
    def of(cls, ev: RoleFailure | TrainingEnded) -> RoleNote:
        if isinstance(ev, RoleFailure):
            return cls(ev.ts, ev.message, ev.task, ev.host, ev.role, ev.action, ev.restarts)
        return cls(ev.ts, ev.message)

    def to_dict(self) -> dict[str, Any]:
        if self.task is None:
            return {"ts": self.ts, "message": self.message}
        return {
            "ts": self.ts,
            "task": self.task,
            "host": self.host,
            "role": self.role,
            "action": self.action,
            "restarts": self.restarts,
            "message": self.message,
        }


@dataclass(frozen=True)
class Roles:
    """A job with roles (plan.json ``strategy``): its role events, in order."""

    strategy: str | None
    events: tuple[RoleNote, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "events": [e.to_dict() for e in self.events]}


@dataclass(frozen=True)
class WorkerRow:
    """One task of the report: its training figures (``TaskFigures``, `status`'s too), its step split
    (the step clock's, in ``figures.split``), its host's evidence and GPUs, its scores."""

    task: str
    host: str | None
    figures: TaskFigures
    rss_mb_max: float | None = None
    gpu_util_pct: float | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()
    profiles: int = 0
    cpu_ms: float | None = None
    evidence: Mapping[str, float | None] = field(default_factory=dict)  # HOST_KEYS
    relative_score: float | None = None
    individual_score: float | None = None

    def part(self, key: str) -> float | None:
        """A part of its step (``step_ms``, ``input_ms``, ..., ``pre_collective_ms``), or None."""
        return (self.figures.split or {}).get(key)

    @property
    def step_ms(self) -> float | None:
        """The step clock's step time, else the progress records' (the figure both views show)."""
        if self.part("step_ms") is not None:
            return self.part("step_ms")
        st = self.figures.step_time_s
        return None if st is None else st * 1000.0

    @property
    def after_ms(self) -> float | None:
        """After the all-reduce: the optimizer update and the framework between steps."""
        update = self.part("update_ms")
        return None if update is None else update + (self.part("host_ms") or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The flat row of ``report --json`` ``workers``: the figures under `status`'s names."""
        out: dict[str, Any] = {
            "host": self.host,
            **self.figures.to_dict(),
            "rss_mb_max": self.rss_mb_max,
            "gpu_util_pct": self.gpu_util_pct,
            "gpus": list(self.gpus),
            "profiles": self.profiles,
            "cpu_ms": self.cpu_ms,
            **(self.figures.split or {}),
            **{k: self.evidence.get(k) for k in HOST_KEYS},
        }
        if self.relative_score is not None or self.individual_score is not None:
            out.update(relative_score=self.relative_score, individual_score=self.individual_score)
        return out


def flat_workers(workers: Mapping[str, WorkerRow]) -> dict[str, dict[str, Any]]:
    """The rows as the pure policies read them (``split``, ``pace``, ``supervise.stragglers``: the same
    mappings the live monitor judges), computed from the model, never kept beside it."""
    return {t: w.to_dict() for t, w in workers.items()}


@dataclass(frozen=True)
class GpuModels:
    """GPU models and memory per host; ``mixed`` when hosts differ (every step waits for the slowest)."""

    per_host: Mapping[str, list[str]] = field(default_factory=dict)
    mixed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"per_host": dict(self.per_host), "mixed": self.mixed}


@dataclass(frozen=True)
class Analysis:
    """The job's split (``split.job_split``), its scaling efficiency and the advice in plain words."""

    efficiency: float | None
    split: JobSplit | None
    advice: tuple[str, ...]
    suggested_last_s: int | None = None


@dataclass(frozen=True)
class Report:
    """The report of one run (``report.build_report``)."""

    run_dir: str
    job: str | None
    window: Window | None
    workers: Mapping[str, WorkerRow]
    throughput: Mapping[str, float | None]
    gpu_models: GpuModels
    gpu_problems: tuple[Mapping[str, Any], ...]
    gpu_clocks: Mapping[str, Mapping[str, Any]]
    shared_problems: tuple[Mapping[str, Any], ...]
    pace: Pace | None
    stragglers: tuple[StragglerNote, ...]
    slowing: tuple[SlowingNote, ...]
    roles: Roles | None
    evaluations: Mapping[str, list[dict[str, Any]]] | None
    analysis: Analysis
    goodput: Goodput | None
    loss: LossCurve | None
    noise_scale: NoiseScale
    #: hosts lost for good and what replaced them (``reshapes.reshape_report``), in order
    reshapes: tuple[Mapping[str, Any], ...] = ()

    @property
    def split(self) -> JobSplit | None:
        return self.analysis.split

    @property
    def efficiency(self) -> float | None:
        return self.analysis.efficiency

    @property
    def advice(self) -> tuple[str, ...]:
        return self.analysis.advice

    def straggler_tasks(self) -> set[str]:
        """The tasks named stragglers during the run."""
        return {str(s.task) for s in self.stragglers}

    def to_dict(self) -> dict[str, Any]:
        """``report --json``: the keys scripts read (a part a run lacks is left out, as it always was:
        ``roles``, ``evaluations``, ``suggested_last_s``)."""
        out: dict[str, Any] = {
            "run_dir": self.run_dir,
            "job": self.job,
            "window": self.window.to_dict() if self.window else None,
            "workers": flat_workers(self.workers),
            "throughput": dict(self.throughput),
            "gpu_models": self.gpu_models.to_dict(),
            "gpu_problems": [dict(p) for p in self.gpu_problems],
            "gpu_clocks": dict(self.gpu_clocks),
            "shared_problems": [dict(p) for p in self.shared_problems],
            "pace": self.pace.to_dict() if self.pace else None,
            "stragglers": [s.to_dict() for s in self.stragglers],
            "slowing": [s.to_dict() for s in self.slowing],
        }
        if self.roles is not None:
            out["roles"] = self.roles.to_dict()
        if self.evaluations:
            out["evaluations"] = self.evaluations
        if self.reshapes:
            out["reshapes"] = [dict(r) for r in self.reshapes]
        split = self.analysis.split
        out.update(efficiency=self.analysis.efficiency, split=split.to_dict() if split else None)
        out["advice"] = list(self.analysis.advice)
        if self.analysis.suggested_last_s is not None:
            out["suggested_last_s"] = self.analysis.suggested_last_s
        out["goodput"] = self.goodput.to_dict() if self.goodput else None
        out["loss"] = self.loss.to_dict() if self.loss else None
        out["noise_scale"] = self.noise_scale.to_dict()
        return out
