"""Goodput as ``report`` holds it: where the wall time went, typed (``goodput.goodput`` computes it).

Why a module of its own: ``goodput`` is the arithmetic (the categories adding up to the wall, the
attempts, the backups); this is what the text, the HTML bar, TensorBoard's end scalars and ``report
--json`` read. ``to_dict`` writes the JSON shape ``report --json`` always printed: an attempt's keys are
only those its path through the run set (``training_s`` only when it trained, ``lost_work_s`` and
``backup`` only when it failed, ``until_next_attempt_s`` or ``teardown_s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: The categories, in the report's order, with their labels; they add up to the wall time.
CATEGORIES = {
    "productive_s": "productive training steps",
    "startup_s": "startup until the first step (per attempt)",
    "input_stall_s": "input stalls (part of step time)",
    "straggler_wait_s": "waiting for the slowest worker (part of step time)",
    "redone_s": "work redone: training since the last backup",
    "host_lost_s": "recovering from a lost host: failure -> new plan",
    "failure_s": "restarting in place after a failure",
    "teardown_s": "after the last step: final save, exit",
    "gather_s": "gathering logs and checkpoints",
    "other_s": "other",
}
#: An attempt's optional parts, in ``report --json``'s order.
_ATTEMPT_PARTS = (
    "training_s",
    "lost_work_s",
    "backup",
    "work_redone_steps",
    "until_next_attempt_s",
    "cause",
    "loss_ts",
    "loss_to_training_s",
    "teardown_s",
)
#: Parts written even when None, given the part that brings them (``views.recovery``: unknown, not absent).
_NULLABLE = {"work_redone_steps": "lost_work_s", "loss_to_training_s": "cause"}


@dataclass(frozen=True)
class AttemptTime:
    """One attempt's share of the wall (seconds): each part only when the attempt had it."""

    attempt: int
    state: str | None
    startup_s: float
    training_s: float | None = None
    lost_work_s: float | None = None
    backup: str | None = None  # why its training after the last backup counts as lost
    work_redone_steps: int | None = None  # steps reported since the last backup (a floor)
    until_next_attempt_s: float | None = None
    cause: str | None = None  # ``host_lost`` or ``restart`` when another attempt followed a failure
    loss_ts: float | None = None  # the loss (``events.recovery.loss_ts``)
    loss_to_training_s: float | None = None  # the loss to the next attempt's first step
    teardown_s: float | None = None

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> AttemptTime:
        return cls(d["attempt"], d["state"], d["startup_s"], **{k: d[k] for k in _ATTEMPT_PARTS if k in d})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attempt": self.attempt, "state": self.state, "startup_s": self.startup_s}
        out.update(
            {
                k: v
                for k in _ATTEMPT_PARTS
                if (v := getattr(self, k)) is not None or getattr(self, _NULLABLE.get(k, k)) is not None
            }
        )
        return out


@dataclass(frozen=True)
class Goodput:
    """``report --json`` ``goodput``: the wall split into ``CATEGORIES`` (``seconds``), ``goodput`` (a
    fraction; None when no step was reported), the attempts, the others' wait for a worker's input."""

    wall_s: float
    seconds: Mapping[str, float]  # CATEGORIES' keys, in order
    goodput: float | None
    finished: bool
    step_clock: bool
    attempts: tuple[AttemptTime, ...]
    input_waits: Mapping[str, float] = field(default_factory=dict)
    recovery: Mapping[str, Any] | None = None  # ``recovery.totals``: the cost of failures, summed
    backup_interval: Mapping[str, Any] | None = None  # ``backup_interval.backup_advice``
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Goodput:
        """From ``goodput.goodput``'s figures (its one caller: the owner builds it once)."""
        return cls(
            wall_s=d["wall_s"],
            seconds={k: d[k] for k in CATEGORIES},
            goodput=d["goodput"],
            finished=d["finished"],
            step_clock=d["step_clock"],
            attempts=tuple(AttemptTime.of(a) for a in d["attempts"]),
            input_waits=dict(d["input_waits"]),
            recovery=d.get("recovery"),
            backup_interval=d["backup_interval"],
            notes=tuple(d["notes"]),
        )

    def noted(self, note: str) -> Goodput:
        return replace(self, notes=(*self.notes, note))

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            **{k: self.seconds[k] for k in CATEGORIES},
            "goodput": self.goodput,
            "finished": self.finished,
            "step_clock": self.step_clock,
            "attempts": [a.to_dict() for a in self.attempts],
            "input_waits": dict(self.input_waits),
            "recovery": self.recovery,
            "backup_interval": self.backup_interval,
            "notes": list(self.notes),
        }
