"""Roles in the decision loop (``plan.roles``: the table), a collaborator of ``supervisor.Supervisor``:
each task's rule (whether it holds the go, is a collective member, trains), what its failure does
(``tolerance``: decided there, carried out here — the incarnation ends, the event says what follows),
the restart of one task alone, in place, and the end of the training (the tasks that never end by
themselves are stopped then, and the attempt is a success).

The loop owns the tasks' sessions: ``restart`` returns the new incarnation for the loop to install,
and ``training_end`` returns a stop order for the loop to carry out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from worker_entry import protocol as p
from worker_entry.protocol.roles import CLUSTER_ROLES

from ..backends import Backend, Channel
from ..core.result import Failure
from ..core.states import TaskState
from ..events import EventBus
from ..events import kinds as ev
from ..plan.build import tf_cluster
from ..plan.roles import RoleRule, rule_of
from ..spec import ClusterSpec
from .inputs import ChannelPump
from .placement import endpoint_problem
from .session import TaskSession
from .teardown import StopOrder, never_start
from .tolerance import Tolerance, tolerate

#: A TF endpoint a node may report: HOST:PORT or [IPV6]:PORT (anything else is not used).
_ENDPOINT = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")

Deliver = Callable[[str, "Channel | BaseException"], None]


def _endpoint(text: str | None) -> str:
    """A reported endpoint when it is one, else ""."""
    return text if text and _ENDPOINT.match(text) else ""


class RoleCare:
    def __init__(
        self,
        spec: ClusterSpec,
        tasks: Iterable[str],
        backend: Backend,
        pump: ChannelPump,
        bus: EventBus,
        *,
        attempt: int,
        deliver: Deliver,
    ) -> None:
        """``deliver``: the loop's input queue, where a restarted task's channel (or why there is none) goes."""
        self.backend = backend
        self.pump = pump
        self.bus = bus
        self.attempt = attempt
        self.deliver = deliver
        self.limit = spec.restart.max_task_restarts
        self.rules: dict[str, RoleRule] = {t: rule_of(spec.tensorflow.strategy, t) for t in tasks}
        self.restarts: dict[str, int] = {}  # restarts in place per task
        self.tolerated: list[Failure] = []  # failures of roles that do not take the job down
        self.training_ended = False
        # only jobs with a role that is not a collective member need the end-of-training check
        self._sidecars = any(not r.trains for r in self.rules.values())

    def members(self) -> set[str]:
        """The collective's members (judged for startup, progress, stragglers, GPUs)."""
        return {t for t, r in self.rules.items() if r.collective}

    def holding_go(self) -> set[str]:
        """The tasks the go waits for (not a sidecar evaluator: it gets its go when it is up)."""
        return {t for t, r in self.rules.items() if r.holds_go}

    def optional(self) -> set[str]:
        """Tasks whose end does not decide the attempt's outcome (they do not train)."""
        return {t for t, r in self.rules.items() if not r.trains}

    # --- a failure ---------------------------------------------------------------------------------

    def judge(self, failure: Failure, *, stopping: bool, went: bool) -> Tolerance:
        """What ``failure`` does to the job (``tolerance``), with this task's rule and restarts so far."""
        t = failure.task
        return tolerate(
            failure,
            self.rules.get(t) if t is not None else None,
            stopping=stopping,
            went=went,
            restarts=self.restarts.get(t, 0) if t is not None else 0,
            limit=self.limit,
            restarts_tasks=self.backend.restarts_tasks,
            replaces_sidecars=self.backend.replaces_sidecars,
        )

    def absorb(self, s: TaskSession, decision: Tolerance) -> None:
        """A failure its role tolerates: what is left of the incarnation ends, the failure is kept, and
        the ``role_failure`` event says what follows (the restart is the loop's to start)."""
        failure = decision.failure
        self._end_incarnation(s, f"{s.task} failed: {failure.message}")
        self.tolerated.append(failure)
        self.bus.emit(
            ev.RoleFailure(
                task=s.task,
                host=s.host,
                role=s.task.partition(":")[0],
                kind=failure.kind,
                action=decision.action,
                restarts=decision.restarts,
                message=failure.message,
            )
        )
        if decision.action == "restart":
            self.restarts[s.task] = decision.restarts

    def _end_incarnation(self, s: TaskSession, reason: str) -> None:
        """Stop what is left of a failed task (a stopped process, a silent node) and close its channel:
        its worker_entry kills the task's process group when the channel goes."""
        if s.state == TaskState.PENDING:  # its start is under way: the channel is closed when it comes
            never_start(s, self.backend)
        elif s.state.is_alive:
            s.stop_sent = True
            s.send(p.Stop(grace_s=0, reason=reason))
            s.become(TaskState.STOPPED)
        self.pump.remove(s.key)
        s.abandoned = True
        s.close()

    # --- a restart in place ------------------------------------------------------------------------

    def restart(self, old: TaskSession, n: int, peers: Iterable[TaskSession]) -> tuple[TaskSession, str | None]:
        """Start the task again, alone, in place (same host, TF port and TF_CONFIG), in its own task
        directory (``-restart-N``): its new incarnation (its channel comes through ``deliver``), and why
        it cannot start when no retry can mend it (then it is not started)."""
        node = old.node
        new = TaskSession(node, self.attempt)
        new.key = f"{old.task}#{n}"
        new.restarts = n
        new.placement = old.placement  # until its hello says where it is
        config = node.node_config(self.attempt)
        base = config.remote_dir
        config.remote_dir = f"{base}-restart-{n}"
        config.adopt_dirs = [base, *(f"{base}-restart-{k}" for k in range(1, n))]  # gathered with this one
        key = new.key
        try:
            if not config.cluster:  # its node built it (Slurm): the same cluster, as the nodes said
                self._with_cluster(config, old, peers)
        except ValueError as exc:
            return new, f"cannot restart {old.task} in place: {exc}"

        def deliver(_task: str, chan: Channel | BaseException) -> None:
            self.deliver(key, chan)

        try:
            self.backend.restart_task(node, config, deliver, old.placement)
        except OSError as exc:
            deliver(old.task, exc)
        return new, None

    @staticmethod
    def _with_cluster(config: p.NodeConfig, old: TaskSession, peers: Iterable[TaskSession]) -> None:
        """The restarted task's cluster (worker_entry builds its TF_CONFIG) from the endpoints every task's
        node reported in its hello: where its peers listen, and its own old place (its port is free again)."""
        order = list(peers)
        endpoints = [_endpoint(s.placement.tf_endpoint) for s in order]
        tasks = [s.node.task for s in order]
        missing = [
            s.task for s, ep in zip(order, endpoints, strict=True) if not ep and s.node.task.type in CLUSTER_ROLES
        ]
        if missing:
            raise ValueError(f"cannot rebuild TF_CONFIG: {', '.join(missing[:3])} never said where it listens")
        for s, ep in zip(order, endpoints, strict=True):  # a node speaks only for where it is itself
            if ep and (why := endpoint_problem(ep, s.channel)):
                raise ValueError(f"cannot rebuild TF_CONFIG: {s.task}: {why}")
        config.cluster = tf_cluster(tasks, endpoints)
        own = _endpoint(old.placement.tf_endpoint)
        port = own.rpartition(":")[2]
        config.tf_port = int(port) if port.isdigit() and 0 < int(port) < 65536 else None

    # --- the training's end ------------------------------------------------------------------------

    def training_end(self, sessions: Mapping[str, TaskSession], *, stopping: bool) -> StopOrder | None:
        """Every training task exited 0: stop the tasks that never end by themselves (a success)."""
        if not self._sidecars or self.training_ended or stopping:
            return None
        if not all(s.state == TaskState.SUCCEEDED for t, s in sessions.items() if self.rules[t].trains):
            return None
        left = [t for t, s in sessions.items() if not s.state.is_terminal]
        if not left:
            return None
        self.training_ended = True
        reason = f"training ended: stopping {', '.join(left)}"
        return StopOrder(reason, bounded=True, announce=ev.TrainingEnded(message=reason, stopping=len(left)))
