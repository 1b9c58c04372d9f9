"""Roles in the decision loop (``plan.roles``: the table): a failure that does not take the job
down (a parameter-server worker restarted alone, in place; a sidecar evaluator reported), the go a
late task gets, and the end of the training — the tasks that never end by themselves are stopped then,
and the attempt is a success. Mixed into the supervisor, like ``teardown``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from worker_entry import protocol as p
from worker_entry.protocol.roles import CLUSTER_ROLES

from ..backends import Backend, Channel
from ..core.result import Failure
from ..core.states import JobState, TaskState
from ..events import EventBus
from ..events import kinds as ev
from ..plan import Plan
from ..plan.build import tf_cluster
from ..plan.roles import RoleRule, rule_of
from ..spec import ClusterSpec
from .inputs import ChannelPump
from .monitor import Monitor
from .session import TaskSession

#: A TF endpoint a node may report: HOST:PORT or [IPV6]:PORT (anything else is not used).
_ENDPOINT = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")


def _endpoint(text: str | None) -> str:
    """A reported endpoint when it is one, else ""."""
    return text if text and _ENDPOINT.match(text) else ""


#: Failures that say the host or the spec is wrong, not the task: never tolerated.
_NEVER_TOLERATED = frozenset({"preflight", "connect", "restart"})


class RoleCare:
    """Mixed into the supervisor: the attributes below are its own."""

    spec: ClusterSpec
    plan: Plan
    backend: Backend
    bus: EventBus
    attempt: int
    sessions: dict[str, TaskSession]
    monitor: Monitor
    pump: ChannelPump
    snapshots: Any
    clock: Callable[[], float]
    state: JobState
    stopping_reason: str | None
    went_at: float | None

    def _init_roles(self) -> None:
        strategy = self.spec.tensorflow.strategy
        self.rules: dict[str, RoleRule] = {t: rule_of(strategy, t) for t in self.sessions}
        self.keys: dict[str, TaskSession] = dict(self.sessions)  # channel key -> session, restarted ones too
        self.restarts: dict[str, int] = {}
        self.tolerated: list[Failure] = []  # failures of roles that do not take the job down
        self.training_ended = False
        # only jobs with a role that is not a collective member need the end-of-training check
        self._sidecars = any(not r.trains for r in self.rules.values())

    def _members(self) -> set[str]:
        return {t for t, r in self.rules.items() if r.collective}

    def _retired(self, s: TaskSession) -> bool:
        """An incarnation replaced by a restart: what it still sends is only logged."""
        return self.sessions.get(s.task) is not s

    def _tolerate(self, failure: Failure) -> Failure | None:
        """None when the failure's role does not take the job down (handled here); else the failure
        the job fails with (a restart budget spent says so)."""
        t = failure.task
        rule = self.rules.get(t) if t is not None else None
        if t is None or rule is None or rule.on_failure == "teardown" or self.stopping_reason is not None:
            return failure
        if failure.kind in _NEVER_TOLERATED or (rule.on_failure == "restart" and self.went_at is None):
            return failure
        s = self.sessions[t]
        done = self.restarts.get(t, 0)
        limit = self.spec.restart.max_task_restarts
        # a sidecar its scheduler starts again anyway (Kubernetes) is followed there, within the budget
        follow = rule.on_failure == "report" and self.backend.replaces_sidecars
        if follow and done >= limit:
            follow = False
            failure = dataclasses.replace(
                failure,
                message=f"{failure.message} (its replacements are not followed: "
                f"restarted {done} time(s), restart.max_task_restarts {limit})",
            )
        if rule.on_failure == "restart":
            if not self.backend.restarts_tasks:
                return dataclasses.replace(
                    failure, message=f"{failure.message} (this scheduler cannot restart one task)"
                )
            if done >= limit:
                return dataclasses.replace(
                    failure,
                    message=f"{failure.message} (restarted {done} time(s) already: restart.max_task_restarts {limit})",
                )
        self._end_incarnation(s, f"{t} failed: {failure.message}")
        self.tolerated.append(failure)
        action = "restart" if rule.on_failure == "restart" or follow else "report"
        restarts = done + 1 if action == "restart" else done
        self.bus.emit(
            ev.RoleFailure(
                task=t,
                host=s.host,
                role=t.partition(":")[0],
                kind=failure.kind,
                action=action,
                restarts=restarts,
                message=failure.message,
            )
        )
        if action == "restart":
            self.restarts[t] = restarts
            self._restart(s, restarts)
        self.snapshots.touch(t)
        return None

    def _end_incarnation(self, s: TaskSession, reason: str) -> None:
        """Stop what is left of a failed task (a stopped process, a silent node) and close its channel:
        its worker_entry kills the task's process group when the channel goes."""
        if s.state == TaskState.PENDING:  # its start is under way: the channel is closed when it comes
            self._never_start(s)
        elif s.state.is_alive:
            s.stop_sent = True
            s.send(p.Stop(grace_s=0, reason=reason))
            s.become(TaskState.STOPPED)
        self.pump.remove(s.key)
        s.abandoned = True
        s.close()

    def _restart(self, old: TaskSession, n: int) -> None:
        """Start the task again, alone, in place (same host, TF port and TF_CONFIG), in its own task
        directory (``-restart-N``), and give it the go as soon as it says hello."""
        node = old.node
        new = TaskSession(node, self.attempt, self.monitor.on_terminal)
        new.key = f"{old.task}#{n}"
        new.restarts = n
        new.placement = old.placement  # until its hello says where it is
        self.sessions[old.task] = new
        self.keys[new.key] = new
        self.monitor.revive(old.task, self.clock())
        config = node.node_config(self.attempt)
        base = config.remote_dir
        config.remote_dir = f"{base}-restart-{n}"
        config.adopt_dirs = [base, *(f"{base}-restart-{k}" for k in range(1, n))]  # gathered with this one
        key = new.key

        def deliver(_task: str, chan: Channel | BaseException) -> None:
            self._deliver(key, chan)

        try:
            if not config.cluster:  # its node built it (Slurm): the same cluster, as the nodes said
                self._with_cluster(config, old)
        except ValueError as exc:  # no retry can mend it: the job fails now, saying why
            new.become(TaskState.NOT_STARTED)
            self._fail(self._failure("restart", f"cannot restart {old.task} in place: {exc}", new, last_lines=()))
            return
        try:
            self.backend.restart_task(node, config, deliver, old.placement)
        except OSError as exc:
            deliver(old.task, exc)

    def _with_cluster(self, config: p.NodeConfig, old: TaskSession) -> None:
        """The restarted task's cluster (worker_entry builds its TF_CONFIG) from the endpoints every task's
        node reported in its hello: where its peers listen, and its own old place (its port is free again)."""
        order = list(self.sessions.values())
        endpoints = [_endpoint(s.placement.tf_endpoint) for s in order]
        tasks = [s.node.task for s in order]
        missing = [
            s.task for s, ep in zip(order, endpoints, strict=True) if not ep and s.node.task.type in CLUSTER_ROLES
        ]
        if missing:
            raise ValueError(f"cannot rebuild TF_CONFIG: {', '.join(missing[:3])} never said where it listens")
        config.cluster = tf_cluster(tasks, endpoints)
        own = _endpoint(old.placement.tf_endpoint)
        port = own.rpartition(":")[2]
        config.tf_port = int(port) if port.isdigit() and 0 < int(port) < 65536 else None

    def _deliver(self, task: str, chan: Channel | BaseException) -> None:  # the supervisor's
        raise NotImplementedError

    def _fail(self, failure: Failure) -> None:  # the supervisor's
        raise NotImplementedError

    def _failure(self, kind: str, message: str, s: TaskSession | None, **fields: Any) -> Failure:  # the supervisor's
        raise NotImplementedError

    def _never_start(self, s: TaskSession) -> None:  # teardown's
        raise NotImplementedError

    def _late_go(self, s: TaskSession) -> None:
        """A task that said hello after the go (a sidecar evaluator, a restarted worker) starts now."""
        if self.went_at is not None and self.stopping_reason is None and s.state == TaskState.READY:
            s.send(p.Go())

    def _check_training_end(self) -> None:
        """Every training task exited 0: stop the tasks that never end by themselves (a success)."""
        if not self._sidecars or self.training_ended or self.stopping_reason is not None:
            return
        if not all(s.state == TaskState.SUCCEEDED for t, s in self.sessions.items() if self.rules[t].trains):
            return
        left = [t for t, s in self.sessions.items() if not s.state.is_terminal]
        if not left:
            return
        self.training_ended = True
        names = ", ".join(left)
        self.bus.emit(ev.TrainingEnded(message=f"training ended: stopping {names}", stopping=len(left)))
        self._teardown(f"training ended: stopping {names}", bounded=True)

    def _teardown(self, reason: str, grace: float | None = None, signum: int = 15, *, bounded: bool = False) -> None:
        raise NotImplementedError  # the supervisor's (teardown.Teardown)
