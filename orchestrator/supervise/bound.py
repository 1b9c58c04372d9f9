"""A bounded run: stop the job cleanly after N training steps or D seconds of training.

`tfcluster scale` measures each size for a bounded time, and `launch --max-steps/--max-duration`
makes a smoke test of a long job. The steps are the instrumentation's own counters (the step clock
counts any MWMS loop), so no change to the user's script is needed. Reaching the bound is a success:
the job is torn down like `tfcluster stop`, but its result is ``succeeded``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RunBound:
    steps: int | None = None  # every running worker has made this many training steps
    seconds: float | None = None  # of training, from the first step any worker reported

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError("steps must be at least 1")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError("seconds must be positive")

    @property
    def active(self) -> bool:
        return self.steps is not None or self.seconds is not None

    def describe(self) -> str:
        parts = ([f"{self.steps} steps"] if self.steps else []) + ([f"{self.seconds:g} s"] if self.seconds else [])
        return " or ".join(parts)


class BoundWatch:
    """Decides, from the workers' step counters, when a bounded run has had enough."""

    def __init__(self, bound: RunBound, startup_s: float = 0.0) -> None:
        self.bound = bound
        self.startup_s = startup_s  # how long a script may take to its first step (job.startup_timeout_s)
        self.first_step_at: float | None = None

    def check(self, steps: Mapping[str, int | None], now: float, went_at: float | None) -> str | None:
        """Why the run should stop now (None: not yet). ``steps``: each running worker's step count
        (None before its first progress record); ``went_at``: when the go was sent."""
        if not steps or went_at is None:
            return None
        if self.first_step_at is None and any(s for s in steps.values()):
            self.first_step_at = now
        b = self.bound
        if b.steps is not None and all(s is not None and s >= b.steps for s in steps.values()):
            return f"every worker made {b.steps} training steps (--max-steps)"
        if b.seconds is not None:
            # A script whose steps nobody counts (instrumentation off, no MWMS): the time counts from
            # the end of its startup budget, so a slow start (imports, tracing) is not mistaken for it.
            if self.first_step_at is not None:
                start, since = self.first_step_at, "the first training step"
            else:
                start, since = went_at + self.startup_s, "the startup budget (no worker reports training steps)"
            if now - start >= b.seconds:
                return f"{b.seconds:g} s of training since {since} (--max-duration)"
        return None
