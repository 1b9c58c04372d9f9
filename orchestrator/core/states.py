"""Task and job states, as enums with predicates; one function from a signal to a job state."""

from __future__ import annotations

import enum
import signal


class TaskState(str, enum.Enum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # worker_entry started, waiting for its hello
    READY = "ready"  # hello received, waiting for the go
    RUNNING = "running"  # the training command runs
    STOPPING = "stopping"  # asked to stop
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # non-zero exit, a signal of its own, or a protocol error
    STOPPED = "stopped"  # ended by our teardown
    LOST = "lost"  # no exit status: connection or host gone
    NOT_STARTED = "not_started"  # never ran (preflight refused, or teardown before the go)

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_TASK

    @property
    def is_alive(self) -> bool:
        return self in (TaskState.STARTING, TaskState.READY, TaskState.RUNNING, TaskState.STOPPING)

    def can_become(self, new: TaskState) -> bool:
        """The one table of task transitions (``TaskSession.become`` enforces it)."""
        return new in _TASK_NEXT[self]


_TERMINAL_TASK = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST, TaskState.NOT_STARTED}
)
#: What each task state may become: a task moves forward only, and a terminal state is final.
_TASK_NEXT: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.STARTING, TaskState.NOT_STARTED}),  # channel up / never started
    TaskState.STARTING: frozenset({TaskState.READY, TaskState.STOPPING}) | _TERMINAL_TASK,  # hello
    TaskState.READY: frozenset({TaskState.RUNNING, TaskState.STOPPING}) | _TERMINAL_TASK,  # spawned after the go
    TaskState.RUNNING: frozenset({TaskState.STOPPING}) | _TERMINAL_TASK,
    TaskState.STOPPING: _TERMINAL_TASK,
    **{t: frozenset() for t in _TERMINAL_TASK},
}


class JobState(str, enum.Enum):
    CONNECTING = "connecting"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    REQUEUED = "requeued"  # scheduler: the allocation ended (preemption, time limit); the job waits for the next
    GATHERING = "gathering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CONNECT_FAILED = "connect_failed"  # a host could not be reached: nothing ran
    START_FAILED = "start_failed"  # a task's worker_entry could not start or broke the protocol: nothing ran
    PREFLIGHT_FAILED = "preflight_failed"  # hosts unfit (versions, ports, GPUs): nothing ran
    INTERRUPTED_SIGINT = "interrupted_sigint"
    INTERRUPTED_SIGTERM = "interrupted_sigterm"

    @property
    def is_terminal(self) -> bool:
        return self not in _LIVE_JOB

    @property
    def is_interrupted(self) -> bool:
        return self in (JobState.INTERRUPTED_SIGINT, JobState.INTERRUPTED_SIGTERM)

    @property
    def nothing_ran(self) -> bool:
        """Failures before the go: no training command was started."""
        return self in (JobState.CONNECT_FAILED, JobState.START_FAILED, JobState.PREFLIGHT_FAILED)


_LIVE_JOB = frozenset(
    {
        JobState.CONNECTING,
        JobState.STARTING,
        JobState.RUNNING,
        JobState.STOPPING,
        JobState.RESTARTING,
        JobState.REQUEUED,
        JobState.GATHERING,
    }
)

_SIGNAL_STATES = {signal.SIGINT: JobState.INTERRUPTED_SIGINT, signal.SIGTERM: JobState.INTERRUPTED_SIGTERM}


def interrupted_state(signum: int) -> JobState:
    """The final state of a job interrupted by ``signum`` (SIGINT, else SIGTERM; SIGHUP does not
    interrupt a job: see job/signals.py)."""
    return _SIGNAL_STATES.get(signal.Signals(signum), JobState.INTERRUPTED_SIGTERM)
