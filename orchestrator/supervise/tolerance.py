"""What a task's failure does to the job, by its role (``plan.roles``) and the restart budget. Pure.

The role table says what a role's failure means under the job's strategy: ``teardown`` (the job fails
with it: a chief, a ps, every MWMS worker), ``restart`` (a parameter-server worker starts again alone,
in place, while ``restart.max_task_restarts`` lasts), ``report`` (a sidecar evaluator: only reported;
where its scheduler starts it again by itself, Kubernetes, the replacement is followed within the same
budget). This module decides and words the decision; the decision loop carries it out (ends the
incarnation, emits the event, restarts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..core.result import Failure
from ..plan.roles import RoleRule

#: Failures that say the host or the spec is wrong, not the task: never tolerated.
NEVER_TOLERATED = frozenset({"preflight", "connect", "restart"})


@dataclass(frozen=True)
class Tolerance:
    """The decision about one failure."""

    #: ``teardown``: the job fails with ``failure`` (the first is the root cause); ``restart``: the task
    #: starts again in place (or its scheduler's replacement is followed); ``report``: only reported.
    action: Literal["teardown", "restart", "report"]
    #: the failure as the job records it: worded with why it is not tolerated when the budget says so
    failure: Failure
    #: the task's restarts in place, this one included
    restarts: int = 0


def tolerate(
    failure: Failure,
    rule: RoleRule | None,
    *,
    stopping: bool,
    went: bool,
    restarts: int,
    limit: int,
    restarts_tasks: bool,
    replaces_sidecars: bool,
) -> Tolerance:
    """The decision for ``failure`` of a task whose role has ``rule`` (None: not a task's failure).

    ``stopping``: the job is already being torn down (every failure is then the job's); ``went``: the
    go was sent (before it, a restart would wait for nothing); ``restarts``: the task's restarts so far,
    ``limit`` the budget; ``restarts_tasks`` / ``replaces_sidecars``: what the scheduler can do."""
    if failure.task is None or rule is None or rule.on_failure == "teardown" or stopping:
        return Tolerance("teardown", failure)
    if failure.kind in NEVER_TOLERATED or (rule.on_failure == "restart" and not went):
        return Tolerance("teardown", failure)
    # a sidecar its scheduler starts again anyway (Kubernetes) is followed there, within the budget
    follow = rule.on_failure == "report" and replaces_sidecars
    if follow and restarts >= limit:
        follow = False
        failure = _worded(
            failure,
            f"its replacements are not followed: restarted {restarts} time(s), restart.max_task_restarts {limit}",
        )
    if rule.on_failure == "restart":
        if not restarts_tasks:
            return Tolerance("teardown", _worded(failure, "this scheduler cannot restart one task"))
        if restarts >= limit:
            why = f"restarted {restarts} time(s) already: restart.max_task_restarts {limit}"
            return Tolerance("teardown", _worded(failure, why))
    if rule.on_failure == "restart" or follow:
        return Tolerance("restart", failure, restarts + 1)
    return Tolerance("report", failure, restarts)


def _worded(failure: Failure, why: str) -> Failure:
    return dataclasses.replace(failure, message=f"{failure.message} ({why})")
