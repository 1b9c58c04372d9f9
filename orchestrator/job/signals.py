"""Signals on the launcher.

SIGINT (Ctrl-C) and SIGTERM (`tfcluster stop`) tear the job down cleanly, then the launcher exits;
a second one kills at once. SIGHUP — the terminal went away (ssh session dropped, laptop closed) —
does *not* stop the job: like `nohup`, the launcher moves what it printed on the terminal into
RUN/launcher.log and goes on supervising; `tfcluster status/logs/stop RUN` work as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from ..supervise import Interrupt

STOPPING = (signal.SIGINT, signal.SIGTERM)


def detach_output(log: Path) -> None:
    """Send fds 1 and 2 to ``log`` (append): every later print lands there, none fails on a dead tty."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)


class Hangup:
    """Set by SIGHUP (in the handler: output moved to the log at once); acted on by the job's loop."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.count = 0
        self.handled = 0

    def __call__(self, signum: int, frame: object) -> None:
        if self.count == 0:
            detach_output(self.log)
        self.count += 1


@contextlib.contextmanager
def signals_to(interrupt: Interrupt, hangup: Hangup | None = None, also: tuple[int, ...] = ()) -> Iterator[None]:
    """SIGINT/SIGTERM (and ``also``: a scheduler's own, e.g. Slurm's SIGUSR2) go to ``interrupt``;
    SIGHUP to ``hangup`` (ignored without one)."""
    previous = {s: signal.signal(s, lambda signum, frame: interrupt.trigger(signum)) for s in (*STOPPING, *also)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hangup or signal.SIG_IGN)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
