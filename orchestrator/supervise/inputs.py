"""What reaches the decision loop: channels as tasks come up, bytes the pump reads, signals.

The channel pump: one thread selects over every task's channel and queues what arrives.

The decision loop never blocks on one host. The queue is bounded: when the loop falls behind, the
pump waits, stops reading, and the SSH window (or socket buffer) pushes back to the node, whose
worker_entry pauses reading its child's output — back-pressure, never loss or unbounded memory.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
import time
from dataclasses import dataclass

from ..backends import Channel

QUEUE_ITEMS = 1024


class Interrupt:
    """Set from signal handlers (SIGINT/SIGTERM on the launcher, SIGUSR2 under Slurm), read by the loop.
    ``first`` is the signal that started it (USR2 then Slurm's SIGTERM is still a time limit)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.first: int | None = None
        self.count = 0

    def trigger(self, signum: int) -> None:
        if self.first is None:
            self.first = signum
        self.signum = signum
        self.count += 1


@dataclass(frozen=True)
class ChannelReady:
    """The backend brought a task up (``channel``) or could not (``error``)."""

    task: str
    channel: Channel | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Received:
    """Bytes from one task's channel (``eof``: both of its streams ended)."""

    task: str
    out: bytes
    err: bytes
    eof: bool


class ChannelPump(threading.Thread):
    def __init__(self, out: queue.Queue) -> None:
        super().__init__(name="channel-pump", daemon=True)
        self.out = out
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self.spill: list[Received] = []  # read, but the queue was full when we were told to stop

    def add(self, task: str, chan: Channel) -> None:
        with self._lock:
            self._channels[task] = chan
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def remove(self, task: str) -> None:
        with self._lock:
            self._channels.pop(task, None)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _put(self, item: Received) -> None:
        """Queue what was read; never drop it (on stop it is kept in ``spill`` for the last drain)."""
        while True:
            try:
                self.out.put(item, timeout=0.5)
                return
            except queue.Full:
                if self._stopping:
                    self.spill.append(item)
                    return

    def run(self) -> None:
        try:
            while not self._stopping:
                with self._lock:
                    fdmap = {fd: task for task, chan in self._channels.items() for fd in chan.filenos()}
                try:
                    ready, _, _ = select.select([self._wake_r, *fdmap], [], [], 1.0)
                except (OSError, ValueError):
                    time.sleep(0.05)
                    continue
                for fd in ready:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        continue
                    task = fdmap[fd]
                    with self._lock:
                        chan = self._channels.get(task)
                    if chan is None:
                        continue
                    try:
                        out, err, eof = chan.read()
                    except Exception as exc:  # a broken channel is an EOF with a reason
                        out, err, eof = b"", f"channel error: {exc}\n".encode(), True
                    if out or err or eof:
                        self._put(Received(task, out, err, eof))
                    if eof:
                        self.remove(task)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)
