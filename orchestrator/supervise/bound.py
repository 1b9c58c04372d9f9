"""A bounded run: stop the job cleanly after N training steps or D seconds of training.

`tfcluster scale` measures each size for a bounded time, and `launch --max-steps/--max-duration`
makes a smoke test of a long job. The steps are the instrumentation's own counters (the step clock
counts any MWMS loop), so no change to the user's script is needed. Reaching the bound is a success:
the job is torn down like `tfcluster stop`, but its result is ``succeeded``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: A bound by examples stops a run whose examples nobody counts after this many steps (it would never end).
EXAMPLES_UNKNOWN_STEPS = 50


@dataclass(frozen=True)
class RunBound:
    steps: int | None = None  # every running worker has made this many training steps
    seconds: float | None = None  # of training, from the first step any worker reported
    examples: int | None = None  # every running worker has counted this many examples (the global batch's)

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError("steps must be at least 1")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError("seconds must be positive")
        if self.examples is not None and self.examples < 1:
            raise ValueError("examples must be at least 1")

    @property
    def active(self) -> bool:
        return self.steps is not None or self.seconds is not None or self.examples is not None

    def describe(self) -> str:
        parts = ([f"{self.steps} steps"] if self.steps else []) + ([f"{self.seconds:g} s"] if self.seconds else [])
        parts += [f"{self.examples:,} examples"] if self.examples else []
        return " or ".join(parts)


class BoundWatch:
    """Decides, from the workers' step counters, when a bounded run has had enough."""

    def __init__(self, bound: RunBound, startup_s: float = 0.0) -> None:
        self.bound = bound
        self.startup_s = startup_s  # how long a script may take to its first step (job.startup_timeout_s)
        self.first_step_at: float | None = None

    def check(
        self,
        steps: Mapping[str, int | None],
        now: float,
        went_at: float | None,
        examples: Mapping[str, int | None] | None = None,
    ) -> str | None:
        """Why the run should stop now (None: not yet). ``steps``: each running worker's step count
        (None before its first progress record); ``examples``: its examples so far (the global batch's,
        as the step clock counts them); ``went_at``: when the go was sent."""
        if not steps or went_at is None:
            return None
        if self.first_step_at is None and any(s for s in steps.values()):
            self.first_step_at = now
        b = self.bound
        if b.steps is not None and all(s is not None and s >= b.steps for s in steps.values()):
            return f"every worker made {b.steps} training steps (--max-steps)"
        if b.examples is not None:
            seen = {t: (examples or {}).get(t) for t in steps}
            if all(e is not None and e >= b.examples for e in seen.values()):
                return f"every worker trained on {b.examples:,} examples (--examples)"
            if any(e is None and (steps[t] or 0) >= EXAMPLES_UNKNOWN_STEPS for t, e in seen.items()):
                return (
                    f"no examples counted after {EXAMPLES_UNKNOWN_STEPS} steps (the batch has no dimension the step "
                    "clock reads): --examples cannot bound this run"
                )
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
