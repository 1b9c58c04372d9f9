"""The fake node's channel (``tests/fakenode.py``): the launcher's side a real pipe, so the real pump,
decoder and session read it; what the launcher sends is queued for the node's script. Its descriptors are
held as a real channel's are: closed at the close (the launcher's ends) or the hang-up (the node's), at
collection otherwise, never closed twice, never written once closed."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import weakref

from orchestrator.backends import Channel


def drain(open_fds: list[int], fds: tuple[int, int], *, close: bool) -> dict[int, bytearray]:
    """What the non-blocking ``open_fds`` hold now, by descriptor (of ``fds``); one that ends (EOF, or
    an error: closed under the reader) leaves ``open_fds``, closed too when ``close``."""
    got = {fd: bytearray() for fd in fds}
    for fd in list(open_fds):
        while True:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                open_fds.remove(fd)
                if close:
                    os.close(fd)
                break
            got[fd] += data
    return got


class FakeChannel(Channel):
    """The launcher's end reads a real pipe (so ``select`` works); what it sends is queued for the node."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        self._er, self._ew = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._er, False)
        self.inbox: queue.Queue[bytes | None] = queue.Queue()
        self.closed = False
        self.status: int | None = None
        self.asked = 0  # how often the launcher asked for the exit status
        self._open = [self._r, self._er]
        self._reads = threading.Lock()  # the pump reads while the supervisor may close: never a double close
        self._ends = threading.Lock()
        self._ends_open = [self._w, self._ew]  # the node's ends: closed once, by end_output or at collection
        weakref.finalize(self, FakeChannel._close_all, self._open, self._ends_open)

    # launcher side
    def filenos(self) -> list[int]:
        with self._reads:
            return list(self._open)

    def read(self) -> tuple[bytes, bytes, bool]:
        with self._reads:
            got = drain(self._open, (self._r, self._er), close=True)
            return bytes(got[self._r]), bytes(got[self._er]), not self._open

    def send(self, data: bytes) -> None:
        if self.closed:
            raise OSError("channel closed")
        self.inbox.put(data)

    def exit_status(self) -> int | None:
        self.asked += 1
        return self.status

    def close(self) -> None:
        """As a real channel's close: the launcher's ends are closed (what the node writes after it is
        lost, as on a closed socket) and the node sees EOF on its stdin."""
        if not self.closed:
            self.closed = True
            self.inbox.put(None)  # the node sees EOF on its stdin
            with self._reads:
                FakeChannel._close_all(self._open)

    @staticmethod
    def _close_all(*groups: list[int]) -> None:
        """Closes and forgets ``groups``' descriptors (in place: the finalizer holds the same lists). At
        collection: a channel dropped without its node hanging up leaves none open."""
        for fds in groups:
            for fd in list(fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds.clear()

    # node side
    def write(self, data: bytes) -> None:
        self._write(self._w, data)

    def write_err(self, data: bytes) -> None:
        self._write(self._ew, data)

    def _write(self, fd: int, data: bytes) -> None:
        with self._ends, contextlib.suppress(OSError):  # never to a number closed (and perhaps reused)
            if fd in self._ends_open:
                os.write(fd, data)

    def hang_up(self, status: int | None = None) -> None:
        self.status = status
        self.end_output()

    def end_output(self) -> None:
        """The node's output ends (EOF on the launcher's side), its exit status not known (yet)."""
        with self._ends:
            FakeChannel._close_all(self._ends_open)
