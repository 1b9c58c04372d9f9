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
    RESHAPE = "reshape"  # start again on a new plan: a host lost for good out, a spare in (or its workers fewer)
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


#: A host's tasks by role, as the planner takes them: ((role, count), ...) in ``ROLE_ORDER``.
HostRoles = tuple[tuple[str, int], ...]
ROLE_ORDER = ("chief", "worker", "ps", "evaluator")  # protocol.roles.ROLES: the planner's rank order
TRAINERS = ("chief", "worker")


def _roles(types: list[str]) -> HostRoles:
    return tuple((r, types.count(r)) for r in ROLE_ORDER if types.count(r))


def _count(roles: HostRoles, *which: str) -> int:
    return sum(n for r, n in roles if r in which)


@dataclass(frozen=True)
class Members:
    """Who runs the job now: the hosts of the current plan (distinct, in plan order), every task
    (``tasks[i]`` runs on ``task_hosts[i]``; ``task_hosts`` empty: one task per host, ``hosts[i]``),
    the spares standing by, the hosts excluded so far; what the spec allows (``restart.min_workers``),
    whether the scheduler can build a plan without a host (``reshapes``) and, where it can only swap a
    host for a spare, why it cannot run on fewer (``fixed``)."""

    hosts: tuple[str, ...]
    tasks: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()
    planned: int = 0
    min_workers: int = 0
    excluded: tuple[Exclusion, ...] = ()
    reshapes: bool = False
    task_hosts: tuple[str, ...] = ()
    #: each host's tasks by role, the next plan's to lay out (a spare takes the lost host's, a worker
    #: takes the chief of a lost host); () where every host runs the planner's default
    roles: tuple[tuple[str, HostRoles], ...] = ()
    fixed: str | None = None

    @property
    def elastic(self) -> bool:
        """The spec asked for it (spares, or min_workers below the plan) and the scheduler can do it:
        otherwise a failed host restarts in place, as before issue 34. A job that has excluded a host
        stays elastic when its last spare is used: the next lost host ends the run saying why
        (``without``), not a restart in place on a host that is gone (found by bench/elastic_sim.py)."""
        return self.reshapes and (bool(self.spares) or self.min_workers < self.planned or bool(self.excluded))

    @property
    def placed(self) -> tuple[str, ...]:
        """Each task's host."""
        return self.task_hosts or self.hosts

    @property
    def workers(self) -> int:
        """The training tasks (chief and workers) now."""
        if self.tasks:
            return sum(1 for t in self.tasks if t.partition(":")[0] in TRAINERS)
        if self.roles:
            return sum(_count(r, *TRAINERS) for _, r in self.roles)
        return len(self.hosts)

    def roles_of(self, host: str) -> HostRoles:
        return self.roles_by_host().get(host, ())

    def roles_by_host(self) -> dict[str, HostRoles]:
        """Each host's tasks by role: as given (``roles``), else from the plan's tasks — one pass over
        them (a host at a time was quadratic: 0.8 s a reshape decision at 4,096 tasks)."""
        given = dict(self.roles)
        types: dict[str, list[str]] = {}
        for t, h in zip(self.tasks, self.placed, strict=False):
            types.setdefault(h, []).append(t.partition(":")[0])
        return {h: given[h] if h in given else _roles(types.get(h, [])) for h in self.hosts}

    def position(self, out: Exclusion) -> int | None:
        if out.task is not None and out.task in self.tasks:
            host = self.placed[self.tasks.index(out.task)]
            return self.hosts.index(host) if host in self.hosts else None
        return self.hosts.index(out.host) if out.host in self.hosts else None

    def without(self, out: Exclusion) -> tuple[Members, Reshape] | str:
        """The next members with ``out``'s host out, all its tasks with it: a spare in its place (same
        position, the same tasks: its task indices), else the job without them while the workers left are
        >= min_workers — the chief is kept where its host is alive, a worker takes it where it is not;
        or why the run cannot go on (a ps or the evaluator with no spare to take it, too few workers,
        a scheduler that cannot run on fewer hosts). The next plan's tasks are the planner's to name
        (``tasks`` is left empty until it is built)."""
        at = self.position(out)
        if at is None:
            return f"{out.host} is not one of the job's hosts"
        host = self.hosts[at]
        out = replace(out, host=host)
        roles = self.roles_by_host()
        lost = roles.pop(host)
        before = self.workers
        excluded = (*self.excluded, out)
        if self.spares:
            spare, rest = self.spares[0], self.spares[1:]
            roles[spare] = lost
            hosts = (*self.hosts[:at], spare, *self.hosts[at + 1 :])
            nxt = self._next(hosts, roles, excluded, spares=rest)
            return nxt, Reshape(out, spare, before, before, nxt)
        why = f"host {host} is out ({out.reason}) and no spare host is left"
        ran = ", ".join(t for t, h in zip(self.tasks, self.placed, strict=False) if h == host) or "its task"
        if _count(lost, "ps"):
            return (
                f"{why} to take its ps task(s) ({ran}): parameter-server training cannot lose a ps, its "
                "variables live there; add a spare host"
            )
        if _count(lost, "evaluator"):
            return f"{why} to take the sidecar evaluator ({ran}): only a spare host takes it over; add a spare host"
        if self.fixed is not None:
            return f"{why}: {self.fixed}"
        after = before - _count(lost, *TRAINERS)
        if after < max(self.min_workers, 1):
            return f"{why}: {after} worker(s) would remain, below restart.min_workers ({self.min_workers})"
        hosts = (*self.hosts[:at], *self.hosts[at + 1 :])
        if _count(lost, "chief"):  # a worker takes the chief: the first host left that has one
            heir = next((h for h in hosts if _count(roles[h], "worker")), None)
            if heir is None:
                return f"{why}: no worker is left to take the chief ({ran})"
            roles[heir] = _promoted(roles[heir])
        nxt = self._next(hosts, roles, excluded, spares=())
        return nxt, Reshape(out, None, before, after, nxt)

    def _next(self, hosts: tuple[str, ...], roles: dict[str, HostRoles], excluded: tuple, spares: tuple) -> Members:
        """The members of the next plan (its tasks the planner's to name)."""
        return replace(
            self,
            hosts=hosts,
            tasks=(),
            task_hosts=(),
            spares=spares,
            excluded=excluded,
            roles=tuple((h, roles[h]) for h in hosts),
        )


def _promoted(roles: HostRoles) -> HostRoles:
    """One of a host's workers becomes the chief."""
    counts = dict(roles)
    counts["chief"] = counts.get("chief", 0) + 1
    counts["worker"] -= 1
    return tuple((r, counts[r]) for r in ROLE_ORDER if counts.get(r))


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
