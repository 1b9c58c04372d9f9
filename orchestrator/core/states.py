"""Task and job states, as enums with predicates, each with its one transition table; one function from a
signal to a job state."""

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
        return self in _ALIVE_TASK  # (a set built once: asked for every message a node sends)

    def can_become(self, new: TaskState) -> bool:
        """The one table of task transitions (``TaskSession.become`` enforces it)."""
        return new in _TASK_NEXT[self]


_TERMINAL_TASK = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST, TaskState.NOT_STARTED}
)
_ALIVE_TASK = frozenset({TaskState.STARTING, TaskState.READY, TaskState.RUNNING, TaskState.STOPPING})
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
    """A run's or an attempt's state: a *live phase* while something is under way, an *outcome* once
    it is decided. Every change goes through ``advance`` (the one table, ``_JOB_NEXT``); every state
    has its exit code in ``cli/exitcodes.py`` or is refused there (a live phase never ends a command
    but REQUEUED, which ends a Slurm batch step)."""

    # live phases
    CONNECTING = "connecting"  # the run reaches its nodes
    STARTING = "starting"  # an attempt's tasks start (the run stays here while the attempt runs)
    RUNNING = "running"  # an attempt after the go
    STOPPING = "stopping"  # an attempt's teardown
    RESTARTING = "restarting"  # between two attempts of a run
    REQUEUED = "requeued"  # scheduler: the allocation ended (preemption, time limit); the job waits for the next
    # outcomes
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CONNECT_FAILED = "connect_failed"  # a host could not be reached: nothing ran
    START_FAILED = "start_failed"  # a task's worker_entry could not start or broke the protocol: nothing ran
    PREFLIGHT_FAILED = "preflight_failed"  # hosts unfit (versions, ports, GPUs): nothing ran
    INTERRUPTED_SIGINT = "interrupted_sigint"
    INTERRUPTED_SIGTERM = "interrupted_sigterm"

    @property
    def is_terminal(self) -> bool:
        """An outcome (not a live phase)."""
        return self not in _LIVE_JOB

    @property
    def is_interrupted(self) -> bool:
        return self in (JobState.INTERRUPTED_SIGINT, JobState.INTERRUPTED_SIGTERM)

    @property
    def nothing_ran(self) -> bool:
        """Failures before the go: no training command was started."""
        return self in (JobState.CONNECT_FAILED, JobState.START_FAILED, JobState.PREFLIGHT_FAILED)

    def can_become(self, new: JobState) -> bool:
        """The one table of job transitions (``advance`` enforces it)."""
        return new in _JOB_NEXT[self]


class InvalidJobTransition(RuntimeError):
    """A job state change the table (``JobState.can_become``) does not allow: a bug in the launcher."""


def advance(old: JobState, new: JobState) -> JobState:
    """``new`` when the table allows ``old`` -> ``new`` (or they are the same), else InvalidJobTransition.
    Every holder of a job state (the supervisor's attempt, ``AttemptResult``, ``RunResult``) changes it
    through here."""
    if new is not old and not old.can_become(new):
        raise InvalidJobTransition(f"job state {old.value} -> {new.value}")
    return new


_LIVE_JOB = frozenset(
    {
        JobState.CONNECTING,
        JobState.STARTING,
        JobState.RUNNING,
        JobState.STOPPING,
        JobState.RESTARTING,
        JobState.REQUEUED,
    }
)
_OUTCOMES = frozenset(s for s in JobState if s not in _LIVE_JOB)
_INTERRUPTED = frozenset({JobState.INTERRUPTED_SIGINT, JobState.INTERRUPTED_SIGTERM})
#: What the policy may make of an attempt that did not succeed: the allocation ended under it (a
#: requeue: a boundary, not an end), or every task completed its training meanwhile (a success).
_REREAD = frozenset({JobState.REQUEUED, JobState.SUCCEEDED})
#: What each job state may become. A run: CONNECTING -> STARTING (an attempt) -> RESTARTING -> STARTING
#: ... -> its outcome (or REQUEUED); an attempt: STARTING -> RUNNING (the go) -> STOPPING -> its outcome.
#: An outcome changes only as the policy and the run's end read it (below); nothing goes back to a phase.
_JOB_NEXT: dict[JobState, frozenset[JobState]] = {
    # reached (or not), or the earlier allocation completed the training, or interrupted meanwhile
    JobState.CONNECTING: frozenset({JobState.STARTING, JobState.CONNECT_FAILED, JobState.SUCCEEDED}) | _INTERRUPTED,
    # the go or a teardown (an attempt); the attempt's outcome, a restart or a requeue (a run)
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.STOPPING, JobState.RESTARTING}) | _OUTCOMES | _REREAD,
    JobState.RUNNING: frozenset({JobState.STOPPING}) | _OUTCOMES,
    JobState.STOPPING: _OUTCOMES,
    JobState.RESTARTING: frozenset({JobState.STARTING, JobState.CONNECT_FAILED}) | _INTERRUPTED,  # reconnect
    JobState.REQUEUED: frozenset({JobState.FAILED}),  # not requeued after all (slurm.max_requeues, own allocation)
    JobState.SUCCEEDED: frozenset({JobState.FAILED}),  # the run's end: a run that recorded failures did not succeed
    JobState.FAILED: _REREAD,
    JobState.CONNECT_FAILED: frozenset(),
    JobState.START_FAILED: _REREAD,
    JobState.PREFLIGHT_FAILED: _REREAD,
    JobState.INTERRUPTED_SIGINT: _REREAD,
    # + Slurm: the follower's Ctrl-C reaches the batch job as scancel's SIGTERM (RUN/slurm/stop.json says so)
    JobState.INTERRUPTED_SIGTERM: _REREAD | {JobState.INTERRUPTED_SIGINT},
}

_SIGNAL_STATES = {signal.SIGINT: JobState.INTERRUPTED_SIGINT, signal.SIGTERM: JobState.INTERRUPTED_SIGTERM}


def interrupted_state(signum: int) -> JobState:
    """The final state of a job interrupted by ``signum`` (SIGINT, else SIGTERM; SIGHUP does not
    interrupt a job: see job/signals.py)."""
    return _SIGNAL_STATES.get(signal.Signals(signum), JobState.INTERRUPTED_SIGTERM)
