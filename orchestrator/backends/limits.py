"""Open-file descriptors: a launcher holds a few per task, and the soft limit is 1024 on most systems.

A channel is one to three descriptors (a socket; an SSH transport's socket and its channel's pipe), and
each task's live log is one more. At a thousand tasks the usual soft limit (1024) is gone before the
job starts, and the failure would come late and look like anything but a limit (a refused accept, a
log that cannot be opened). So the launcher raises its soft limit to the hard limit when it starts,
and says so — before anything runs — when even the hard limit is too low for the job.
"""

from __future__ import annotations

import resource

PER_TASK = 4  # SSH: transport socket, channel pipe (2), the task's log; connect-back needs 2
BASE = 64  # run files, the listener, the metrics server, wake pipes, transfers' spares


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


def needed(tasks: int) -> int:
    """Descriptors a launcher of ``tasks`` tasks may hold at once."""
    return BASE + PER_TASK * tasks


def nofile_warning(tasks: int) -> str | None:
    """What to tell the user when this process cannot open enough descriptors for ``tasks`` tasks."""
    soft, hard = raise_nofile()
    want = needed(tasks)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return None
    return (
        f"the open-file limit is {soft} (hard limit {'unlimited' if hard == resource.RLIM_INFINITY else hard}); "
        f"{tasks} tasks may need up to {want} descriptors: tasks beyond the limit will fail to connect or log. "
        f"Raise it before launching (ulimit -Hn {want}; LimitNOFILE= in a systemd unit; nofile in "
        "/etc/security/limits.conf)"
    )
