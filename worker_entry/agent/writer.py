"""The node's side of the launcher link: frames written by one thread, so a stalled network can never
stop the event loop from enforcing its timeouts."""

from __future__ import annotations

import collections
import os
import selectors
import threading
import time

CHUNK = 256 * 1024


class FrameWriter(threading.Thread):
    """Writes frames to the launcher's channel; the event loop never blocks on the network."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="frame-writer", daemon=True)
        self.fd = fd
        self._chunks: collections.deque[bytes] = collections.deque()
        self._cond = threading.Condition()
        self.pending = 0
        self.broken = False
        self._writing = False
        self._waiter: selectors.BaseSelector | None = None

    def send(self, data: bytes) -> None:
        if self.broken:
            return
        with self._cond:
            self._chunks.append(data)
            self.pending += len(data)
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks:
                    self._cond.wait()
                batch = []
                size = 0
                while self._chunks and size < CHUNK:
                    c = self._chunks.popleft()
                    batch.append(c)
                    size += len(c)
                self._writing = True
            data = memoryview(b"".join(batch))
            try:
                while data:
                    try:
                        n = os.write(self.fd, data)
                    except BlockingIOError:  # a non-blocking socket (connect-back): wait until writable
                        self._wait_writable()
                        continue
                    data = data[n:]
            except OSError:
                with self._cond:
                    self.broken = True
                    self._chunks.clear()
                    self.pending = 0
                    self._writing = False
                    self._cond.notify_all()
                return
            with self._cond:
                self.pending -= size
                self._writing = False
                self._cond.notify_all()

    def _wait_writable(self) -> None:
        if self._waiter is None:  # a selector, not select(): any descriptor number
            self._waiter = selectors.DefaultSelector()
            self._waiter.register(self.fd, selectors.EVENT_WRITE)
        self._waiter.select(1.0)

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Block while more than ``limit`` bytes are unsent (a producer's back-pressure)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.pending > limit and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return not self.broken

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._chunks or self._writing) and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return not self.broken
