"""What the monitor is told (``Policy``: the spec's timings and the plan's straggler policy) and what it
answers (``Verdict``: a judgement about a task, fatal or not), and the event each verdict becomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..events import kinds as ev
from ..plan.policy import StragglerPolicy

#: the event each of the monitor's verdicts becomes
VERDICT_EVENTS = {
    "lost": ev.WorkerLost,
    "hung": ev.WorkerHung,
    "stalled": ev.JobStalled,
    "startup_timeout": ev.StartupTimeout,
    "straggler": ev.Straggler,
    "straggler_cleared": ev.StragglerCleared,
    "worker_slowing": ev.WorkerSlowing,
    "gpu_problem": ev.GpuProblemFound,
}


@dataclass(frozen=True)
class Policy:
    """Timings from the spec; the straggler thresholds are the plan's one ``StragglerPolicy`` (the
    same object plan.json keeps, which ``report`` reads back)."""

    interval_s: float = 1.0
    timeout_s: float = 10.0
    startup_timeout_s: float = 300.0
    progress_timeout_s: float | None = 600.0
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)

    @property
    def stopped_after_s(self) -> float:
        return min(self.timeout_s, max(2.0 * self.interval_s, 1.0))

    @property
    def suspect_after_s(self) -> float:
        """Silence long enough to blame a task for a peer's failure (3 missed heartbeats)."""
        return min(self.timeout_s, 3.0 * self.interval_s)

    @classmethod
    def from_spec(cls, spec: Any, stragglers: StragglerPolicy | None = None) -> Policy:
        """The spec's timings, with ``stragglers`` (the plan's policy; built from the spec when not given)."""
        hb = spec.heartbeat
        return cls(
            interval_s=hb.interval_s,
            timeout_s=hb.timeout_s,
            startup_timeout_s=spec.job.startup_timeout_s,
            progress_timeout_s=hb.progress_timeout_s,
            stragglers=stragglers if stragglers is not None else StragglerPolicy.from_spec(spec),
        )


@dataclass(frozen=True)
class Verdict:
    kind: str  # lost | hung | stalled | startup_timeout | straggler | straggler_cleared | worker_slowing | gpu_problem
    task: str | None
    message: str
    fatal: bool
    data: dict[str, Any] = field(default_factory=dict)
