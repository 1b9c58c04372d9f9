"""How an attempt stops: the teardown (one stop per task, the signal, its grace, a deadline), giving
up on tasks that will not confirm their end, and the launcher's own interrupts. The decision loop
(``supervisor.Supervisor``) owns the state it works on; this is the part of it that ends things."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from worker_entry import protocol as p

from ..backends import Backend
from ..core.states import JobState, TaskState, advance
from ..events import EventBus
from ..events import kinds as ev
from ..spec import ClusterSpec
from .inputs import Interrupt
from .session import TaskSession

TEARDOWN_MARGIN_S = 5.0  # past grace: how long to wait for the tasks' exit confirmations


class Teardown:
    """Mixed into the supervisor: the attributes below are its own."""

    spec: ClusterSpec
    backend: Backend
    bus: EventBus
    sessions: dict[str, TaskSession]
    snapshots: Any
    interrupt: Interrupt
    clock: Callable[[], float]
    state: JobState
    stopping_reason: str | None
    teardown_deadline: float | None
    interrupted_by: int | None
    _handled_interrupts: int

    def _teardown(
        self, reason: str, grace: float | None = None, signum: int = signal.SIGTERM, *, bounded: bool = False
    ) -> None:
        grace = self.spec.job.stop_grace_s if grace is None else grace
        self.snapshots.touch()
        if self.stopping_reason is None:
            self.stopping_reason = reason
            self.state = advance(self.state, JobState.STOPPING)
            self.bus.emit(ev.Teardown(reason=reason, grace_s=grace, bounded=bounded))
        for s in self.sessions.values():
            if s.state == TaskState.PENDING:  # its backend start is still under way: never let it run
                self._never_start(s)
            elif s.state.is_alive and (not s.stop_sent or grace == 0):
                s.stop_sent = True
                if s.state in (TaskState.RUNNING, TaskState.READY, TaskState.STARTING):
                    s.become(TaskState.STOPPING)
                s.send(p.Stop(grace_s=grace, reason=reason, signal=int(signum)))
        deadline = self.clock() + grace + TEARDOWN_MARGIN_S
        self.teardown_deadline = min(self.teardown_deadline or deadline, deadline)

    def _never_start(self, s: TaskSession) -> None:
        """A task whose backend start is still under way never runs (its channel is closed when it
        comes); a restart in place under way is ended by its scheduler and may not connect later."""
        s.become(TaskState.NOT_STARTED)
        if s.restarts:
            self.backend.abandon_restart(s.task)

    def _abandon_all(self, reason: str) -> None:
        """Past the teardown deadline: close the channels; worker_entry kills its group on EOF."""
        for s in self.sessions.values():
            self._abandon(s, reason)
        self.teardown_deadline = None

    def _abandon(self, s: TaskSession, reason: str) -> None:
        """Stop waiting for one task's exit status (its node stops it when our channel or pings go)."""
        if s.state.is_terminal:
            return
        self.snapshots.touch(s.task)
        s.close()
        s.become(TaskState.LOST if not s.stop_sent else TaskState.STOPPED)
        self._stopped_waiting(s, reason)

    def _stopped_waiting(self, s: TaskSession, reason: str) -> None:
        """Its exit status will not come (abandoned, or its channel closed during the teardown)."""
        self.bus.emit(
            ev.TaskExited(
                task=s.task, host=s.host, code=None, signal=None, signal_name=None, stopped=True, reason=reason
            )
        )

    def _check_interrupt(self) -> None:
        if self.interrupt.count == self._handled_interrupts:
            return
        self._handled_interrupts = self.interrupt.count
        sig = self.interrupt.signum or signal.SIGINT
        name = signal.Signals(sig).name
        # Ctrl-C reaches the training processes as SIGINT (KeyboardInterrupt in Python, which TF's
        # own SIGTERM handler does not swallow); SIGTERM as SIGTERM.
        forward = signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM
        if self.interrupted_by is None:
            self.interrupted_by = sig
            self.bus.emit(ev.Interrupted(signal=name))
            self._teardown(f"interrupted by {name}", signum=forward)
        else:
            self._teardown(f"interrupted again by {name}: killing now", grace=0, signum=forward)
