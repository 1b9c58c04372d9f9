"""A job that outlives its hosts (issue 34): who runs it now, and the new plan of a reshaped attempt.

The policy (``policy.RestartPolicy``) decides, purely, whether a failed host leaves the run and what
takes its place (``Members.without``); this collaborator of the job's attempt loop does what the
decision says: it asks the scheduler for the plan without that host (``RunScheduling.replan``: its own
planner, so TF_CONFIG and the task indices are rebuilt and the chief stays where its host is alive),
records it as the run's plan with the history of reshapes (plan.json), and says so (``reshaped``).

The backup the next attempt resumes from is whatever backup the tasks have: the chief's, synced to
every task before the restart (``transfers.before_restart``). Seeding a task that never held one — a
spare, or every task when the chief's host is gone — from a copy kept off the hosts is the seam the
backup copy (issue 34 item 4) fills there, not here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..backends import Backend
from ..core.diagnostics import Diagnostic
from ..events import EventBus
from ..events import kinds as ev
from ..plan import Plan
from ..plan.record import PlanChange
from ..runs import RunDir, write_plan
from ..spec import ClusterSpec
from .policy import Action, Decision, Exclusion, Members, Reshape, reshape_decision

if TYPE_CHECKING:
    from .scheduling import RunScheduling


def members_of(
    plan: Plan, spec: ClusterSpec, reshapes: bool, excluded: tuple[Exclusion, ...] = (), fixed: str | None = None
) -> Members:
    """The members of ``plan``: its hosts and each task's, the spares, what ``restart.min_workers``
    allows, what the scheduler can do (``reshapes``; ``fixed``: why it cannot go on with fewer hosts)."""
    planned = plan.planned_workers or len(plan.nodes)
    placed = plan.members or tuple(n.host for n in plan.nodes)
    return Members(
        hosts=tuple(dict.fromkeys(placed)),
        tasks=tuple(str(n.task) for n in plan.nodes),
        spares=plan.spares,
        planned=planned,
        # a job that cannot go on with fewer hosts (``fixed``) is elastic through its spares only
        min_workers=planned if fixed else spec.restart.min_workers or planned,
        excluded=excluded,
        reshapes=reshapes and bool(plan.members),
        task_hosts=placed,
        fixed=fixed,
    )


class Reshaper:
    """The job's members across attempts and the reshapes so far (plan.json's history)."""

    def __init__(self, spec: ClusterSpec, plan: Plan, scheduling: RunScheduling, rundir: RunDir, bus: EventBus):
        self.spec = spec
        self.scheduling = scheduling
        self.rundir = rundir
        self.bus = bus
        self.members = members_of(plan, spec, scheduling.reshapes, fixed=scheduling.fixed_hosts())
        self.changes: tuple[PlanChange, ...] = ()

    def apply(self, plan: Plan, reshape: Reshape, attempt: int) -> Plan | None:
        """The plan of ``attempt`` without ``reshape.out``'s host, recorded and announced; None when the
        scheduler cannot build it (the run then ends: the decision's reason stands)."""
        new = self.scheduling.replan(plan, reshape.after)
        if new is None:
            return None
        out = reshape.out
        before = dict(zip(self.members.tasks, self.members.placed, strict=False))
        self.changes = (
            *self.changes,
            PlanChange(
                attempt=attempt,
                out=out.host,
                reason=out.reason,
                spare_in=reshape.spare_in,
                workers_before=reshape.workers_before,
                workers_after=reshape.workers_after,
                lost_ts=out.ts,
                hosts_before=before,
            ),
        )
        self.members = members_of(
            new, self.spec, self.scheduling.reshapes, reshape.after.excluded, self.scheduling.fixed_hosts()
        )
        write_plan(self.rundir, new, attempt=attempt, reshapes=self.changes)
        self.bus.emit(
            ev.Reshaped(
                task=out.task,
                host=out.host,
                attempt=attempt,
                reason=out.reason,
                spare_in=reshape.spare_in,
                workers_before=reshape.workers_before,
                workers_after=reshape.workers_after,
                spares_left=len(self.members.spares),
                lost_ts=out.ts,
            )
        )
        return new

    def unreachable(self, problems: list[Diagnostic], attempt: int) -> Decision | None:
        """A host that cannot be reached when a restart starts is lost for good too: the decision
        without the first of them (the others are met again on the next connect), or None when the run
        is not elastic (it ends as it always did: connect failed)."""
        if not problems or not self.members.elastic:
            return None
        d = problems[0]
        out = Exclusion(d.host or d.task or "?", f"connect: {d.message}", attempt, time.time(), d.task)
        return reshape_decision(self.members, out)

    def status(self) -> dict[str, object] | None:
        """What ``status`` shows of it: the hosts excluded, with why, and the spares left."""
        if not self.members.excluded and not self.members.spares:
            return None
        return {
            "excluded": [e.to_dict() for e in self.members.excluded],
            "spares": list(self.members.spares),
            "workers": self.members.workers,
            "planned_workers": self.members.planned,
        }


def connect_elastic(
    backend: Backend, reshaper: Reshaper, plan: Plan, attempt: int
) -> tuple[Plan, list[Diagnostic], Decision | None]:
    """Connect to ``plan``'s hosts; at a restart, a host that cannot be reached is left out while the
    policy allows (one reshape each, within the same attempt). Returns the plan connected to, the
    problems left, and the decision that ended the run when it cannot go on."""
    for _ in range(len(plan.nodes) + len(plan.spares) + 1):
        problems = backend.connect(plan.nodes)
        decision = reshaper.unreachable(problems, attempt) if attempt > 0 else None
        if decision is None:
            return plan, problems, None
        if decision.action is not Action.RESHAPE or decision.reshape is None:
            return plan, problems, decision
        new = reshaper.apply(plan, decision.reshape, attempt)
        if new is None:
            return plan, problems, None
        plan = new
    return plan, backend.connect(plan.nodes), None
