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
from dataclasses import dataclass, replace
from typing import Protocol

from ..core.result import AttemptResult, Failure
from ..core.states import JobState, TaskState
from ..supervise import Interrupt


class Action(enum.Enum):
    RESTART = "restart"  # start every task again (the chief's backup makes them resume)
    RESHAPE = "reshape"  # start again on a new plan: a host lost for good out, a spare in (or one worker fewer)
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
    #: Action.RESHAPE: which host leaves, why, and what takes its place.
    reshape: Reshape | None = None

    @property
    def final(self) -> bool:
        """The run ends here: the last hand-over brings the checkpoint, result.json is written."""
        return self.action is Action.FINISH and self.ended_by is None

    @property
    def restarts(self) -> bool:
        """Another attempt follows under this launcher (on the same plan or a new one)."""
        return self.action in (Action.RESTART, Action.RESHAPE)


#: Root causes that are the host's failure, not the script's (issue 34): the host went silent or its
#: connection closed (lost), its process stopped while others progressed (hung), or it could not be
#: reached or failed preflight when an attempt started. A script that raised ("exit") or a process
#: killed by a signal we did not send ("signal": the OOM killer, the user) restarts in place.
HOST_KINDS = frozenset({"lost", "hung", "connect", "preflight"})


@dataclass(frozen=True)
class Exclusion:
    """A host out of the rest of the run, and why (``status``, ``report``, the ``reshaped`` event)."""

    host: str
    reason: str
    attempt: int  # the attempt it failed in
    ts: float = 0.0  # when it failed (the root cause's time): the start of "loss to training again"
    task: str | None = None  # the task it ran (what finds it among the members)

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "task": self.task, "reason": self.reason, "attempt": self.attempt, "ts": self.ts}


@dataclass(frozen=True)
class Reshape:
    """The next attempt's shape: ``out`` leaves, ``spare_in`` (or nobody) takes its place."""

    out: Exclusion
    spare_in: str | None
    workers_before: int
    workers_after: int
    after: Members  # who runs the next attempt


@dataclass(frozen=True)
class Members:
    """Who runs the job now: the hosts of the current plan (one training task each: ``tasks[i]`` runs on
    ``hosts[i]``, in plan order), the spares standing by, the hosts excluded so far; what the spec allows
    (``restart.min_workers``) and whether the scheduler can build a plan without a host (``reshapes``)."""

    hosts: tuple[str, ...]
    tasks: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()
    planned: int = 0
    min_workers: int = 0
    excluded: tuple[Exclusion, ...] = ()
    reshapes: bool = False

    @property
    def elastic(self) -> bool:
        """The spec asked for it (spares, or min_workers below the plan) and the scheduler can do it:
        otherwise a failed host restarts in place, as before issue 34. A job that has excluded a host
        stays elastic when its last spare is used: the next lost host ends the run saying why
        (``without``), not a restart in place on a host that is gone (found by bench/elastic_sim.py)."""
        return self.reshapes and (bool(self.spares) or self.min_workers < self.planned or bool(self.excluded))

    def position(self, out: Exclusion) -> int | None:
        if out.task is not None and out.task in self.tasks:
            return self.tasks.index(out.task)
        return self.hosts.index(out.host) if out.host in self.hosts else None

    def without(self, out: Exclusion) -> tuple[Members, Reshape] | str:
        """The next members with ``out``'s host out: a spare in its place (same position: its task
        index), else one worker fewer while that is >= min_workers; or why the run cannot go on. The
        next plan's tasks are the planner's to name (``tasks`` is left empty until it is built)."""
        at = self.position(out)
        if at is None:
            return f"{out.host} is not one of the job's hosts"
        out = replace(out, host=self.hosts[at])
        before = len(self.hosts)
        excluded = (*self.excluded, out)
        if self.spares:
            spare, rest = self.spares[0], self.spares[1:]
            hosts = (*self.hosts[:at], spare, *self.hosts[at + 1 :])
            nxt = replace(self, hosts=hosts, tasks=(), spares=rest, excluded=excluded)
            return nxt, Reshape(out, spare, before, before, nxt)
        if before - 1 >= max(self.min_workers, 1):
            hosts = (*self.hosts[:at], *self.hosts[at + 1 :])
            nxt = replace(self, hosts=hosts, tasks=(), excluded=excluded)
            return nxt, Reshape(out, None, before, before - 1, nxt)
        return (
            f"host {out.host} is out ({out.reason}) and no spare host is left: {before - 1} worker(s) would "
            f"remain, below restart.min_workers ({self.min_workers})"
        )


def host_to_blame(attempt: AttemptResult, gpu_faults: frozenset[str] = frozenset()) -> Exclusion | None:
    """The host to exclude after a failed attempt, or None: only the root cause's host (the first
    failing task: its peers' UnavailableError a moment later are victims and never blamed), and only
    for a host reason (``HOST_KINDS``), or a GPU fault by ``supervise.gpus``' DCGM rules on its task
    (``gpu_faults``: the tasks with one). A script that raised is restarted in place."""
    rc = attempt.root_cause
    if rc is None or rc.host is None or attempt.state != JobState.FAILED:
        return None
    first = rc.message.splitlines()[0] if rc.message else rc.kind
    if rc.kind in HOST_KINDS:
        return Exclusion(rc.host, f"{rc.kind}: {first}", rc.attempt, rc.ts, rc.task)
    if rc.task is not None and rc.task in gpu_faults:
        return Exclusion(rc.host, f"GPU fault on {rc.task} ({rc.kind}: {first})", rc.attempt, rc.ts, rc.task)
    return None


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
    def decide(
        self,
        attempt: AttemptResult,
        earlier: Sequence[AttemptResult],
        interrupt: Interrupt,
        members: Members | None = None,
        gpu_faults: frozenset[str] = frozenset(),
    ) -> Decision:
        """What to do after ``attempt`` (``earlier``: the run's attempts before it, every allocation's;
        ``interrupt``: the signals the launcher got; ``members``: who runs the job, for a reshape;
        ``gpu_faults``: the tasks whose GPUs had a fault by DCGM's rules)."""
        ...


@dataclass(frozen=True)
class RestartPolicy:
    """``restart.max_restarts``: a failed attempt is restarted while the budget lasts, unless the user
    interrupted the run. Only failed attempts count (a requeued one was the scheduler's doing), a
    reshape as much as a restart in place. With elastic ``members`` a host that failed for a host
    reason is left out: a reshape (``Members.without``), or the end, saying why."""

    max_restarts: int

    def decide(
        self,
        attempt: AttemptResult,
        earlier: Sequence[AttemptResult],
        interrupt: Interrupt,
        members: Members | None = None,
        gpu_faults: frozenset[str] = frozenset(),
    ) -> Decision:
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
        if attempt.state != JobState.FAILED or used >= self.max_restarts or interrupt.count:
            return Decision(Action.FINISH)
        out = host_to_blame(attempt, gpu_faults) if members is not None and members.elastic else None
        if out is None or members is None:
            return Decision(Action.RESTART)
        return reshape_decision(members, out)


def reshape_decision(members: Members, out: Exclusion) -> Decision:
    """A reshape without ``out.host``, or the end of the run saying why it cannot go on."""
    nxt = members.without(out)
    if isinstance(nxt, str):
        return Decision(Action.FINISH, run_failure=Failure("restart", nxt, out.ts, host=out.host, attempt=out.attempt))
    return Decision(Action.RESHAPE, reshape=nxt[1])
