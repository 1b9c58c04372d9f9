"""The training process's stdout and stderr: every line to the launcher and to the node's own log.

Lines travel whole (a "line" longer than 1 MiB is cut, for progress bars without newlines); the
partial last line is sent at the end. When the launcher link falls 4 MiB behind, reading pauses
until it is under 1 MiB: back-pressure on the child, never loss.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from typing import IO, Any

from . import protocol as p
from .writer import FrameWriter

CHUNK = 256 * 1024
MAX_LINE = 1024 * 1024
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1 * 1024 * 1024


class OutputPipes:
    def __init__(self, sel: selectors.BaseSelector, writer: FrameWriter, log_path: str) -> None:
        self.sel = sel
        self.writer = writer
        self.log: IO[bytes] | None = open(log_path, "wb", buffering=0)  # noqa: SIM115 - the task's lifetime
        self.partial = {p.STDOUT: b"", p.STDERR: b""}
        self.fds: dict[int, int] = {}  # fd -> stream
        self.paused = False

    def add(self, stream: int, pipe: Any) -> None:
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        self.fds[fd] = stream
        self.sel.register(fd, selectors.EVENT_READ, ("out", stream))

    @property
    def open(self) -> bool:
        return bool(self.fds)

    def read(self, fd: int, stream: int) -> bool:
        """Read what is there; False at the pipe's end."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            self.fds.pop(fd, None)
            return False
        buf = self.partial[stream] + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0 and len(buf) > MAX_LINE:
            buf += b"\n"
            cut = len(buf)
        if cut:
            self.emit(stream, buf[:cut])
        self.partial[stream] = buf[cut:]
        return True

    def emit(self, stream: int, data: bytes) -> None:
        if self.log is not None:
            with contextlib.suppress(OSError):  # a full disk on the node must not stop the job
                self.log.write(data)
        self.writer.send(p.log_frame(stream, data))

    def flush_partials(self) -> None:
        for stream in (p.STDOUT, p.STDERR):
            if self.partial[stream]:
                self.emit(stream, self.partial[stream] + b"\n")
                self.partial[stream] = b""

    def backpressure(self) -> None:
        if not self.paused and self.writer.pending > HIGH_WATER:
            for fd in self.fds:
                self.sel.unregister(fd)
            self.paused = True
        elif self.paused and (self.writer.pending < LOW_WATER or self.writer.broken):
            for fd, stream in self.fds.items():
                self.sel.register(fd, selectors.EVENT_READ, ("out", stream))
            self.paused = False

    def close(self) -> int | None:
        """Close the node's log; returns its size."""
        if self.log is None:
            return None
        size = None
        with contextlib.suppress(OSError):
            size = os.fstat(self.log.fileno()).st_size
            self.log.close()
        self.log = None
        return size
