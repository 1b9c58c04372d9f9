"""The training process's stdout and stderr: every line to the launcher and to the node's own log.

Lines travel whole (a "line" longer than 1 MiB is cut); the partial last line is sent at the end.
When the launcher link falls 4 MiB behind, reading pauses until it is under 1 MiB: back-pressure on
the child, never loss.

Progress bars (Keras ``fit``, tqdm) redraw one line with ``\r`` and ``\b``. A complete line is sent
as what a terminal leaves of it (``redraw``: its final text, not a Keras epoch's hundreds of
redraws); the unfinished line is kept as its current text only (bounded however long the epoch),
and sent, at most every ``PROGRESS_EVERY_S`` and only when it changed, as a *progress frame*
(an unfinished line that is not being redrawn is only sent once complete): a LOG
frame of that text ending in ``\r`` instead of ``\n`` — the launcher shows it in place and logs
nothing of it (the line, once complete, is logged).
"""

from __future__ import annotations

import contextlib
import os
import selectors
from typing import IO, Any

from .. import protocol as p
from ..protocol.redraw import redraw, redraw_lines
from .writer import FrameWriter

CHUNK = 256 * 1024
MAX_LINE = 1024 * 1024
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1 * 1024 * 1024
PROGRESS_EVERY_S = 0.5  # per stream: a bar redrawn 20 times a second costs the link 2 frames a second
PROGRESS_MAX = 1024  # bytes of an unfinished line shown in place (a terminal shows less)


def _decoded(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")  # a \b erases a character, not a byte; bad bytes kept


def squash(partial: bytes) -> bytes:
    """An unfinished line reduced to its current text, a ``\\r`` it ends with kept (the next text
    replaces the line): what is still to come redraws the same way, and its size stays a bar's."""
    if b"\r" not in partial and b"\b" not in partial:
        return partial
    return redraw(_decoded(partial)).encode("utf-8", "surrogateescape") + (b"\r" if partial.endswith(b"\r") else b"")


class OutputPipes:
    def __init__(self, sel: selectors.BaseSelector, writer: FrameWriter, log_fd: int | None) -> None:
        """``log_fd``: the node's own log of the task (``taskdir``; None: lines go to the launcher only)."""
        self.sel = sel
        self.writer = writer
        self.log: IO[bytes] | None = os.fdopen(log_fd, "wb", buffering=0) if log_fd is not None else None
        self.partial = {p.STDOUT: b"", p.STDERR: b""}
        self.shown = {p.STDOUT: b"", p.STDERR: b""}  # the unfinished line's text as last sent
        self.shown_at = {p.STDOUT: 0.0, p.STDERR: 0.0}
        self.redrawn = {p.STDOUT: False, p.STDERR: False}  # the unfinished line is being redrawn (a bar)
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
        if cut:
            self.emit(stream, redraw_lines(buf[:cut]))
            self.shown[stream] = b""  # that line is done: its last progress frame is superseded
        rest = buf[cut:]
        self.redrawn[stream] = b"\r" in rest or b"\b" in rest or (self.redrawn[stream] and not cut)
        rest = squash(rest)
        if len(rest) > MAX_LINE:  # a "line" without end and without redraws: sent in pieces
            self.emit(stream, rest + b"\n")
            rest = b""
        self.partial[stream] = rest
        return True

    def tick(self, now: float) -> None:
        """Send each stream's unfinished line (its current text) when it changed, at a bounded rate."""
        for stream, partial in self.partial.items():
            if not partial or not self.redrawn[stream] or now - self.shown_at[stream] < PROGRESS_EVERY_S:
                continue
            text = redraw(_decoded(partial)).encode("utf-8", "surrogateescape")[:PROGRESS_MAX]
            if text and text != self.shown[stream]:
                self.writer.send(p.log_frame(stream, text + b"\r"))  # not in the node's log: not a line
                self.shown[stream] = text
                self.shown_at[stream] = now

    def emit(self, stream: int, data: bytes) -> None:
        if self.log is not None:
            with contextlib.suppress(OSError):  # a full disk on the node must not stop the job
                self.log.write(data)
        self.writer.send(p.log_frame(stream, data))

    def flush_partials(self) -> None:
        for stream in (p.STDOUT, p.STDERR):
            if self.partial[stream]:
                self.emit(stream, redraw_lines(self.partial[stream] + b"\n"))
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
