"""How an attempt stops: the teardown (one stop per task, the signal, its grace, a deadline), giving up
on tasks that will not confirm their end, and the launcher's own interrupts as stop orders.

Collaborators of the decision loop (``supervisor.Supervisor``), which owns the attempt's phase and its
failures: whatever wants the tasks stopped (a failure, an interrupt, a bounded run's end, the training's
end) says so as a ``StopOrder``; the loop announces it and hands it to ``Teardown``, which owns why the
attempt stops and until when it waits for the tasks' ends.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from worker_entry import protocol as p

from ..backends import Backend
from ..core.states import TaskState
from ..events import EventBus
from ..events import kinds as ev
from ..events.base import BaseEvent
from .inputs import Interrupt
from .session import TaskSession

TEARDOWN_MARGIN_S = 5.0  # past grace: how long to wait for the tasks' exit confirmations


@dataclass(frozen=True)
class StopOrder:
    """A decision to stop the attempt's tasks, and why."""

    reason: str
    grace: float | None = None  # None: job.stop_grace_s
    signum: int = signal.SIGTERM
    bounded: bool = False  # the run ends as planned (a bounded run, the training's end): a success
    announce: BaseEvent | None = None  # what the loop emits before the teardown starts (the cause's event)


def never_start(s: TaskSession, backend: Backend) -> None:
    """A task whose backend start is still under way never runs (its channel is closed when it comes);
    a restart in place under way is ended by its scheduler and may not connect later."""
    s.become(TaskState.NOT_STARTED)
    if s.restarts:
        backend.abandon_restart(s.task)


class Teardown:
    """Stops the tasks: the first order starts the teardown (its ``reason``; a ``teardown`` event), each
    live task gets one stop (again with grace 0: kill now), and the tasks have until ``deadline`` (grace
    plus a margin) to confirm their end; then the loop gives up on them (``abandon``)."""

    def __init__(self, backend: Backend, bus: EventBus, stop_grace_s: float, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.bus = bus
        self.stop_grace_s = stop_grace_s
        self.clock = clock
        self.reason: str | None = None  # why the attempt stops (the first order's); None while it runs
        self.deadline: float | None = None  # until when the tasks may take to confirm their end

    def stop(self, order: StopOrder, sessions: Iterable[TaskSession]) -> None:
        grace = self.stop_grace_s if order.grace is None else order.grace
        if self.reason is None:
            self.reason = order.reason
            self.bus.emit(ev.Teardown(reason=order.reason, grace_s=grace, bounded=order.bounded))
        for s in sessions:
            if s.state == TaskState.PENDING:  # its backend start is still under way: never let it run
                never_start(s, self.backend)
            elif s.state.is_alive and (not s.stop_sent or grace == 0):
                s.stop_sent = True
                if s.state in (TaskState.RUNNING, TaskState.READY, TaskState.STARTING):
                    s.become(TaskState.STOPPING)
                s.send(p.Stop(grace_s=grace, reason=order.reason, signal=int(order.signum)))
        deadline = self.clock() + grace + TEARDOWN_MARGIN_S
        self.deadline = min(self.deadline or deadline, deadline)

    def give_up(
        self, now: float, sessions: Mapping[str, TaskSession], silent: Callable[[float], list[str]]
    ) -> list[str]:
        """The tasks given up on now: every one past the deadline (their channels closed: worker_entry
        kills its group on EOF), else those ``silent`` past the heartbeat timeout (their node stops them
        when our pings stop)."""
        if self.deadline is None:
            return []
        if now >= self.deadline:
            reason = "no exit confirmation before the teardown deadline"
            gone = [s.task for s in sessions.values() if self.abandon(s, reason)]
            self.deadline = None
            return gone
        reason = "silent past the heartbeat timeout during the teardown"
        return [t for t in silent(now) if self.abandon(sessions[t], reason)]

    def abandon(self, s: TaskSession, reason: str) -> bool:
        """Stop waiting for one task's exit status (its node stops it when our channel or pings go);
        False when it had ended already."""
        if s.state.is_terminal:
            return False
        s.close()
        s.become(TaskState.LOST if not s.stop_sent else TaskState.STOPPED)
        self.stopped_waiting(s, reason)
        return True

    def stopped_waiting(self, s: TaskSession, reason: str) -> None:
        """Its exit status will not come (abandoned, or its channel closed during the teardown)."""
        self.bus.emit(
            ev.TaskExited(
                task=s.task, host=s.host, code=None, signal=None, signal_name=None, stopped=True, reason=reason
            )
        )


class Interrupts:
    """The launcher's own signals as stop orders. Ctrl-C reaches the training processes as SIGINT
    (KeyboardInterrupt in Python, which TF's own SIGTERM handler does not swallow); SIGTERM as SIGTERM;
    a second signal kills now."""

    def __init__(self, interrupt: Interrupt) -> None:
        self.interrupt = interrupt
        self.by: int | None = None  # the signal that interrupted the attempt (the first)
        self._handled = 0

    def order(self) -> StopOrder | None:
        """The stop a signal that came since the last look asks for, or None."""
        if self.interrupt.count == self._handled:
            return None
        self._handled = self.interrupt.count
        sig = self.interrupt.signum or signal.SIGINT
        name = signal.Signals(sig).name
        forward = signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM
        if self.by is None:
            self.by = sig
            return StopOrder(f"interrupted by {name}", signum=forward, announce=ev.Interrupted(signal=name))
        return StopOrder(f"interrupted again by {name}: killing now", grace=0, signum=forward)
