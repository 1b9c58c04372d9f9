"""Space held back for the run's own record, so a full disk cannot keep it from being written.

A task that floods the run directory, a gather, or a neighbour can fill the disk the run directory is
on; then result.json and status.json — what ``status`` and every reader go by — could not be written,
and a run that succeeded read as "launcher gone". So ``RunDir.create`` allocates ``RESERVE_BYTES``
(``.reserve``, blocks really allocated: ``posix_fallocate``; less where the disk has less). When an
atomic write of a record in the run directory finds no space, the reserve gives up what the write
needs, the write is tried again, and the reserve takes back what the rewrite freed (the old copy). The
run's end (``sinks.record``) removes it. Log files are not records: they go quiet on a full disk
(``sinks.guard``), and the nodes keep their own copies.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

NAME = ".reserve"
#: What result.json and status.json need at once, with room to spare: ~1 KiB per task each at 1,000 tasks.
RESERVE_BYTES = 8 << 20
MIN_BYTES = 256 << 10
#: Beyond a record's own bytes: the temporary file's blocks, the directory entry.
SLACK = 64 << 10
FULL = (errno.ENOSPC, errno.EDQUOT)


def make_reserve(directory: Path, size: int = RESERVE_BYTES) -> int:
    """Allocate the reserve in ``directory``: ``size`` bytes, at most half of what the disk has free
    (the run's first files must fit beside it), halved while the disk refuses (down to ``MIN_BYTES``).
    Returns what it holds (0: none)."""
    with contextlib.suppress(OSError):
        st = os.statvfs(directory)
        size = min(size, st.f_bavail * st.f_frsize // 2)
    try:
        fd = os.open(directory / NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return 0
    try:
        while size >= MIN_BYTES:
            try:
                os.posix_fallocate(fd, 0, size)
                return size
            except OSError as exc:
                if exc.errno not in FULL:
                    return os.fstat(fd).st_size  # a filesystem without fallocate: no reserve
                size //= 2
        return 0
    finally:
        os.close(fd)


def with_reserve(path: Path, need: int, write: Callable[[], None]) -> None:
    """``write()``; if the disk is full and ``path``'s directory holds a reserve, again with ``need``
    bytes (plus slack) of the reserve freed for it, then the reserve made whole again if it can be."""
    try:
        write()
        return
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        failure = exc
    try:
        fd = os.open(path.parent / NAME, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise failure from None
    try:
        held = os.fstat(fd).st_size
        if not held:
            raise failure
        os.ftruncate(fd, max(0, held - need - SLACK))
        write()
        with contextlib.suppress(OSError):  # the rewrite freed the old copy: hold it again
            os.posix_fallocate(fd, 0, held)
    finally:
        os.close(fd)


def release(directory: Path) -> None:
    """The run is recorded: the space goes back to the disk."""
    with contextlib.suppress(OSError):
        os.unlink(directory / NAME)
