"""Run-directory files that never take the job down: a full or unwritable disk is one warning.

The job matters more than the launcher's copy of its output: the nodes keep their own logs, which the
gather brings back (completing ``logs/``) at the end, or ``tfcluster gather RUN`` later. So the first
time the run directory refuses a write, every sink stops writing to that file, one warning says so,
and the job runs on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any


class WriteGuard:
    """Shared by the sinks of one run: remembers the first failure and warns once."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream
        self.failure: str | None = None
        self._lock = threading.Lock()

    def fail(self, path: Path | str, exc: OSError) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = f"cannot write {path}: {exc.strerror or exc}"
        stream = self.stream or sys.stderr
        with contextlib.suppress(OSError, ValueError):
            stream.write(
                f"tfcluster: warning: {self.failure}; the job keeps running, and the nodes keep their own logs "
                "(gathered at the end, or later with `tfcluster gather RUN`)\n"
            )
            stream.flush()


class GuardedFile:
    """A file in the run directory that goes quiet, instead of raising, once the disk says no."""

    def __init__(self, path: Path, mode: str, guard: WriteGuard, buffering: int = -1) -> None:
        self.path = path
        self.guard = guard
        self.f: Any = None
        try:
            self.f = _open_private(path, mode, buffering)
        except OSError as exc:
            guard.fail(path, exc)

    @property
    def ok(self) -> bool:
        return self.f is not None

    def write(self, data: Any) -> None:
        if self.f is None:
            return
        try:
            self.f.write(data)
        except OSError as exc:
            self._drop(exc)

    def flush(self) -> None:
        if self.f is None:
            return
        try:
            self.f.flush()
        except OSError as exc:
            self._drop(exc)

    def close(self) -> None:
        if self.f is None:
            return
        try:
            self.f.close()
        except OSError as exc:
            self.guard.fail(self.path, exc)
        self.f = None

    @property
    def closed(self) -> bool:
        return self.f is None

    def _drop(self, exc: OSError) -> None:
        self.guard.fail(self.path, exc)
        with contextlib.suppress(OSError, ValueError):
            self.f.close()  # a close that fails to flush still closes
        self.f = None


def _open_private(path: Path, mode: str, buffering: int) -> Any:
    """``open(path, mode)`` for appending, but 0600 whatever the umask (a task's lines may hold
    secrets) and never through a symlink; a file that was already there is made private too."""
    if mode not in ("a", "ab"):
        raise ValueError(f"GuardedFile appends; mode {mode!r}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, mode, buffering=buffering)
    except BaseException:
        os.close(fd)
        raise
