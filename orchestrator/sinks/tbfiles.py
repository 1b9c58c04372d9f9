"""TensorBoard's event files: one per TensorBoard run, private, with a bounded number open at once.

An event file is TFRecord-framed ``Event`` protobufs: per record its length (8 bytes, little-endian),
the length's masked CRC32C, the bytes, their masked CRC32C; the first record says ``brain.Event:2``.
The ``Event`` protobuf and the masked CRC32C are tensorboardX's (``crc32c``'s C code when it is
installed: a dependency, ~0.3 µs a record against ~60 µs for tensorboardX's pure-Python fallback).
The framing is ours rather than tensorboardX's ``EventsWriter``, for one reason: a file must be
reopened for appending. ``EventsWriter`` makes a new file each time it is built and keeps it open to
the end, so a launcher of 16,384 tasks held 16,384 event files open beside 16,384 channels, past a
20,000 open-file limit (issue 33). Here at most ``open_files`` are open (``backends.limits.open_files``:
every run's where the limit has room, else ``OPEN_EVENT_FILES``): past that the least recently written
file is closed, and its run's next point appends to the same file.
TensorBoard reads a file written in several sittings as one (it is a sequence of records).

Why tensorboardX at all: TensorBoard's own writer goes through ``tensorboard.compat.tf``, which imports
TensorFlow whenever it is installed (3.7 s and all of TensorFlow in the launcher, measured here), and
``tf.summary`` is TensorFlow. tensorboardX ships its own compiled protobufs and never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..backends.limits import OPEN_EVENT_FILES

#: The cloud clients tensorboardX's record_writer tries at import for s3:// and gs:// paths: boto3 alone
#: was ~half of its import's CPU (2.9 s at the first step on the loaded box); these files are local.
_CLOUD_CLIENTS = ("boto3", "google.cloud.storage")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class Point:
    """One event: scalars of one TensorBoard run at a training step and a wall time."""

    run: str
    step: int
    wall: float
    values: dict[str, float]


def _tensorboardx() -> tuple[Any, Any]:
    """tensorboardX's ``Event`` protobuf class and masked CRC32C, imported without its cloud clients:
    each is marked absent (``sys.modules[name] = None`` makes its import fail) for the import only,
    then unmarked, so anything that imports one later gets the real module."""
    marked = [name for name in _CLOUD_CLIENTS if name not in sys.modules]
    for name in marked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        from tensorboardX.proto import event_pb2
        from tensorboardX.record_writer import masked_crc32c
    finally:
        for name in marked:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return event_pb2.Event, masked_crc32c


def private_dirs(path: Path) -> None:
    """``path`` and any parent it needs, 0700 whatever the umask (an existing directory keeps its mode)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)
        os.chmod(d, 0o700)


def _open_append(directory: Path, name: str, create: bool) -> IO[bytes]:
    """``directory/name`` for appending, 0600, never through a symlink: neither the file nor its run's
    directory (a link planted at either is refused, not followed: the file is opened relative to the
    directory, itself opened with ``O_NOFOLLOW``)."""
    nofollow, cloexec = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_CLOEXEC", 0)
    dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow | cloexec)
    try:
        flags = os.O_WRONLY | os.O_APPEND | nofollow | cloexec | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


class EventFiles:
    """One event file per TensorBoard run (a subdirectory of ``root``), private: 0700 directories,
    0600 files. ``suffix`` tells files of one writer from another's in the same run directory.

    ``flush`` hands the files written since the last one to the kernel (TensorBoard reads them from
    there); tensorboardX's own flush also ``fsync``s, which at 4,096 runs was 4,096 fsyncs every
    ``flush_s`` for a few dozen files written: the files open at ``close`` are synced then, once."""

    def __init__(self, root: Path, suffix: str = "", open_files: int = OPEN_EVENT_FILES) -> None:
        self._event, self._crc = _tensorboardx()
        self.failed: dict[str, str] = {}  # runs whose file could not be opened or written: points go nowhere
        self.root = root
        self.suffix = suffix
        self.open_files = max(1, open_files)
        self._names: dict[str, Path] = {}  # each run's file, made at its first point
        self._open: dict[str, IO[bytes]] = {}  # the files open now, the least recently written first
        self._dirty: set[str] = set()
        self._host = socket.gethostname()  # in every file's name: asked once, not at each run's first point
        private_dirs(root)

    def add(self, point: Point) -> None:
        """One point of one run. A run whose file fails (a link planted at its path, a directory made
        unwritable) loses its points from then on, with the reason in ``failed``; the other runs go on."""
        if point.run in self.failed:
            return
        event = self._event(wall_time=point.wall, step=max(0, point.step))
        for tag, value in point.values.items():
            event.summary.value.add(tag=tag, simple_value=value)
        try:
            self._file(point.run).write(self._record(event.SerializeToString()))
        except OSError as exc:
            self.failed[point.run] = f"{self.root / point.run}: {exc.strerror or exc}"
            with contextlib.suppress(OSError, ValueError, KeyError):
                self._close(point.run)
            return
        self._dirty.add(point.run)

    def _record(self, data: bytes) -> bytes:
        length = _LENGTH.pack(len(data))
        return length + _CRC.pack(self._crc(length)) + data + _CRC.pack(self._crc(data))

    def _file(self, run: str) -> IO[bytes]:
        f = self._open.get(run)
        if f is not None:
            if len(self._open) >= self.open_files:  # full: the least recently written closes first
                self._open[run] = self._open.pop(run)
            return f
        while len(self._open) >= self.open_files:
            self._close(next(iter(self._open)))
        name = self._names.get(run)
        if name is not None:
            try:
                f = self._open[run] = _open_append(name.parent, name.name, create=False)
                return f
            except FileNotFoundError:  # deleted since it was closed for room: a new file takes the points on
                del self._names[run]
        directory = self.root / run
        private_dirs(directory)
        # tensorboardX's name for it: events.out.tfevents.<seconds>.<host><suffix> (another writer's of
        # the same second, a requeued run's, is left alone: this one takes the next free name)
        base = f"events.out.tfevents.{int(time.time())}.{self._host}{self.suffix}"
        for k in range(100):
            name = directory / (base if k == 0 else f"{base}.{k}")
            try:
                f = _open_append(directory, name.name, create=True)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{directory / base}: 100 event files of this second already")
        self._open[run] = f
        self._names[run] = name
        f.write(self._record(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()))
        return f

    def _close(self, run: str) -> None:
        f = self._open.pop(run)
        self._dirty.discard(run)
        f.close()  # (the buffer reaches the kernel as it closes)

    def flush(self) -> None:
        for run in self._dirty:
            f = self._open.get(run)
            if f is not None:
                f.flush()
        self._dirty.clear()

    def close(self) -> None:
        self._dirty.clear()
        for run in list(self._open):
            f = self._open[run]
            with contextlib.suppress(OSError, ValueError):
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(OSError, ValueError):
                self._close(run)
        self._open.clear()


__all__ = ["EventFiles", "Point", "private_dirs"]
