"""Open-file descriptors: a launcher holds a few per task, and the soft limit is 1024 on most systems.

A channel is one to three descriptors (a socket; an SSH transport's socket and its channel's pipe), and
a task's live log and its TensorBoard event file one more each while they are open (every one where the
limit has room, else ``OPEN_LOGS`` and ``OPEN_EVENT_FILES`` of them: ``open_files``; ``sinks.logs`` and
``sinks.tbfiles`` close the one written least recently past that). At a thousand tasks the usual soft
limit (1024) is gone before the job starts, and the failure would come late and look like anything but
a limit (a refused accept, a log that cannot be opened). So the launcher raises its soft limit to the hard limit when it starts,
and says so — before anything runs — when even the hard limit is too low for the job.
"""

from __future__ import annotations

import resource

PER_TASK = 3  # SSH: transport socket, channel pipe (2); connect-back needs 1
BASE = 64  # run files, the listener, the metrics server, wake pipes, transfers' spares
#: The tasks' log files open at once where the limit leaves no room for every task's (a 16,384-task
#: launcher under a 20,000 limit: issue 33); where it does, every one stays open (``open_files``).
OPEN_LOGS = 1024
#: Descriptors left free beyond ``BASE`` before more than the floors are kept open (``open_files``).
LOG_HEADROOM = 1024
#: TensorBoard event files open at once where the limit leaves no room for more (one run per task:
#: ``sinks.tbfiles``; ``open_files``).
OPEN_EVENT_FILES = 512


def raise_nofile() -> tuple[int, int]:
    """The soft limit raised to the hard limit (where the hard limit allows it); (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):  # a container may refuse even that: the check below says so
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def _floors(tasks: int) -> tuple[int, int]:
    """(task logs, event files) open at once at the least: the caps, or every one (+ 1: the job's own run)."""
    return min(tasks, OPEN_LOGS), min(tasks + 1, OPEN_EVENT_FILES)


def needed(tasks: int, per_task: int = PER_TASK) -> int:
    """Descriptors a launcher of ``tasks`` tasks may hold at once, ``per_task`` for each one's channel."""
    return BASE + per_task * tasks + sum(_floors(tasks))


def open_files(tasks: int, per_task: int = PER_TASK, soft: int | None = None) -> tuple[int, int]:
    """(task logs, TensorBoard event files) a launcher keeps open at once: every task's log, then every
    run's event file, where the soft limit (``soft``, else this process's) leaves room for them beside
    the channels and ``LOG_HEADROOM``; else at least ``OPEN_LOGS`` and ``OPEN_EVENT_FILES`` (what
    ``needed`` counts). Why not always the floors: past them the least recently written file is closed,
    and at 4,096 tasks every log line and most TensorBoard points opened and closed a file."""
    logs, events = _floors(tasks)
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return tasks, tasks + 1
    spare = soft - (BASE + LOG_HEADROOM + per_task * tasks + logs + events)
    more_logs = max(0, min(tasks - logs, spare))
    more_events = max(0, min(tasks + 1 - events, spare - more_logs))
    return logs + more_logs, events + more_events


def nofile_warning(tasks: int, per_task: int = PER_TASK) -> str | None:
    """What to tell the user when this process cannot open enough descriptors for ``tasks`` tasks."""
    soft, hard = raise_nofile()
    want = needed(tasks, per_task)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return None
    return (
        f"the open-file limit is {soft} (hard limit {'unlimited' if hard == resource.RLIM_INFINITY else hard}); "
        f"{tasks} tasks may need up to {want} descriptors: tasks beyond the limit will fail to connect or log. "
        f"Raise it before launching (ulimit -Hn {want}; LimitNOFILE= in a systemd unit; nofile in "
        "/etc/security/limits.conf)"
    )
