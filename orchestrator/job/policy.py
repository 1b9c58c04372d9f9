"""After each attempt, one decision: restart the tasks, requeue the run (its allocation ends), or finish.

The shape of torch elastic's ``_invoke_run`` and Ray Train's ``FailurePolicy.make_decision``: the job's
one attempt loop asks a policy and does what it says. The spec's restart budget is ``RestartPolicy``;
a scheduler whose allocations end under the job (Slurm: time limits, preemptions) wraps it with its
own rule, and says why in the decision, so the loop never asks which scheduler it runs under.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.result import AttemptResult, Failure
from ..core.states import JobState, TaskState
from ..supervise import Interrupt


class Action(enum.Enum):
    RESTART = "restart"  # start every task again (the chief's backup makes them resume)
    REQUEUE = "requeue"  # the allocation ends: the run goes on in the scheduler's next one
    FINISH = "finish"  # the run is over (succeeded, failed past its budget, or interrupted)


@dataclass(frozen=True)
class Decision:
    action: Action
    #: The allocation ended under this attempt (a time limit, a preemption): the attempt is recorded as
    #: ``requeued`` with this as its root cause — a boundary, not a failure of the training.
    ended_by: Failure | None = None
    #: A failure of the run itself (e.g. "preempted, not requeued: slurm.max_requeues"), added to the result.
    run_failure: Failure | None = None
    #: Every task completed its training (exit 0) while the run was being stopped: the attempt is
    #: recorded as succeeded, and this says so (a ``training_completed`` event).
    completed: str | None = None

    @property
    def final(self) -> bool:
        """The run ends here: the last hand-over brings the checkpoint, result.json is written."""
        return self.action is Action.FINISH and self.ended_by is None


def all_tasks_exited_0(attempt: AttemptResult) -> bool:
    """Every task of the attempt exited 0: it completed its training, whatever signal came meanwhile
    (a script that saves on SIGTERM to be resumed exits non-zero: PreemptionCheckpointHandler exits 42)."""
    return bool(attempt.tasks) and all(t.state == TaskState.SUCCEEDED for t in attempt.tasks.values())


def every_task_completed(attempt: AttemptResult) -> bool:
    """All tasks exited 0 and nothing failed on the way."""
    return all_tasks_exited_0(attempt) and not attempt.failures


def completed_anyway(attempt: AttemptResult) -> bool:
    """Its tasks completed, but a signal (Ctrl-C, stop, the allocation's end) made it look interrupted."""
    return attempt.state != JobState.SUCCEEDED and every_task_completed(attempt)


def signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name if signum else "a signal"
    except ValueError:
        return f"signal {signum}"


class AttemptPolicy(Protocol):
    def decide(self, attempt: AttemptResult, earlier: Sequence[AttemptResult], interrupt: Interrupt) -> Decision:
        """What to do after ``attempt`` (``earlier``: the run's attempts before it, every allocation's;
        ``interrupt``: the signals the launcher got)."""
        ...


@dataclass(frozen=True)
class RestartPolicy:
    """``restart.max_restarts``: a failed attempt is restarted while the budget lasts, unless the user
    interrupted the run. Only failed attempts count (a requeued one was the scheduler's doing)."""

    max_restarts: int

    def decide(self, attempt: AttemptResult, earlier: Sequence[AttemptResult], interrupt: Interrupt) -> Decision:
        if completed_anyway(attempt):
            sig = signal_name(interrupt.first)
            return Decision(
                Action.FINISH,
                completed=(
                    f"every task exited 0 — it completed its training — while the run was being stopped ({sig}): "
                    "the run is done"
                ),
            )
        used = sum(1 for a in earlier if a.state == JobState.FAILED)
        if attempt.state == JobState.FAILED and used < self.max_restarts and not interrupt.count:
            return Decision(Action.RESTART)
        return Decision(Action.FINISH)
