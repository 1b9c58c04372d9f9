"""What reaches the decision loop: channels as tasks come up, bytes the pump reads, signals.

The channel pump: one thread waits on every task's channel with one selector and queues what arrives.

The decision loop never blocks on one host. The queue is bounded: when the loop falls behind, the
pump waits, stops reading, and the SSH window (or socket buffer) pushes back to the node, whose
worker_entry pauses reading its child's output — back-pressure, never loss or unbounded memory.

A task is judged silent from what the launcher could have read (``read_horizon``): bytes waiting in a
socket the pump has not got to, or in the queue behind thousands of other tasks' handshakes, are not
the node's silence. The pump says how far it has read, and stamps what it queues with how far it had
read before (not with when the queue took it: a pass held back by a full queue for longer than the
heartbeat timeout once made 848 of 4,096 live tasks "lost" whose bytes sat in that pass).
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..backends import Channel

QUEUE_ITEMS = 1024
#: Bytes read and not yet handled, at most (a flooding task's reads are up to a few MiB each: 1,024 of
#: them held 576 MiB of the launcher's memory); past it the pump waits, and back-pressure does the rest.
QUEUE_BYTES = 32 << 20
#: The pump hands what one pass read to the loop in batches of at most this many reads or bytes (one
#: lock and one wake-up of the loop per batch, not per read); the bounds above are passed by one batch at most.
BATCH_ITEMS = 64
BATCH_BYTES = 1 << 20
#: A busy pump starts a pass at most this often, so each pass finds many channels ready: at 1,024 tasks
#: ~25 reads a pass instead of one or two, for at most this much latency (an idle pump reads at once).
PASS_S = 0.02


class InputQueue(queue.Queue):
    """The decision loop's input queue, bounded by items and by the bytes of what was read: a put
    waits while either is full (one read larger than the bound still goes in alone)."""

    def __init__(
        self, maxsize: int = QUEUE_ITEMS, max_bytes: int = QUEUE_BYTES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(maxsize)
        self.max_bytes = max_bytes
        self.bytes = 0
        self.clock = clock
        self._stamps: deque[float] = deque()  # when each item went in (the loop's clock), in order

    def _put(self, item: object, stamp: float | None = None) -> None:
        self.bytes += _size(item)
        self._stamps.append(self.clock() if stamp is None else stamp)
        super()._put(item)

    def _get(self) -> object:
        item = super()._get()
        self.bytes -= _size(item)
        self._stamps.popleft()
        return item

    def put_many(self, items: list[Received], timeout: float, stamp: float | None = None) -> None:
        """Put ``items`` at once, waiting up to ``timeout`` while the queue is full (``queue.Full``): one
        lock and one wake-up of the loop for a whole pass of the pump. ``stamp``: a moment before which
        none of their bytes arrived (the pump's: how far it had read before the pass that read them),
        not the put's: a pass held back by a full queue puts bytes that waited since long before."""
        with self.not_full:
            end = time.monotonic() + timeout
            while self._qsize() >= self.maxsize:
                if (left := end - time.monotonic()) <= 0:
                    raise queue.Full
                self.not_full.wait(left)
            for item in items:
                self._put(item, stamp)
            self.unfinished_tasks += len(items)
            self.not_empty.notify()

    def get_many(self, limit: int) -> list[object]:
        """Up to ``limit`` items already there, without waiting, under one lock (the loop drains what
        came before deciding: one ``get_nowait`` an item was a lock and a notify each, ~2 % of its CPU)."""
        with self.mutex:
            items = [self._get() for _ in range(min(limit, len(self.queue)))]
            if items:
                self.not_full.notify(len(items))
            return items

    def oldest(self) -> float | None:
        """The earliest stamp of an item still waiting for the loop (None: nothing waits); a scan, not the
        first stamp: the pump's stamps are earlier than the put of a channel handed in meanwhile."""
        with self.mutex:
            return min(self._stamps) if self._stamps else None

    def _qsize(self) -> int:
        n = len(self.queue)
        return self.maxsize if n and self.bytes >= self.max_bytes else n  # full by bytes: put waits


def _size(item: object) -> int:
    return len(item.out) + len(item.err) if isinstance(item, Received) else 0


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


class Received(NamedTuple):
    """Bytes from one task's channel (``eof``: both of its streams ended). A named tuple, not a frozen
    dataclass: one is made per read (~1,000 a second at 1,024 tasks), and a frozen dataclass's
    ``__init__`` costs 2.5x a tuple's (its ``object.__setattr__`` per field)."""

    task: str
    out: bytes
    err: bytes
    eof: bool


class ChannelPump(threading.Thread):
    """One thread, one selector (epoll where there is one: any descriptor number, and the cost of a
    wait does not grow with the number of channels) over every task's channel.

    ``add``/``remove`` may be called from any thread: they change the table under the lock and wake
    the pump, which (re)registers the channel's descriptors itself, so the selector is only ever
    touched by its own thread. A channel's descriptors are checked again after each read (a stream
    that ended) and all of them every ``SYNC_S`` (a channel closed by someone else)."""

    SYNC_S = 1.0

    def __init__(self, out: InputQueue, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="channel-pump", daemon=True)
        self.out = out
        self.clock = clock  # the decision loop's: how far the pump has read is compared with its ``now``
        self.idle = False  # waiting in select: everything that arrived has been read and queued
        self.read_through = clock()  # everything that arrived before this was read and queued
        self.reading_since: float | None = None  # inside one channel's read since (a read that hangs)
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self._changed: set[str] = set()
        self._sel = selectors.DefaultSelector()
        self._registered: dict[str, tuple[int, ...]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self.spill: list[Received] = []  # read, but the queue was full when we were told to stop

    def add(self, task: str, chan: Channel) -> None:
        with self._lock:
            self._channels[task] = chan
            self._changed.add(task)
        self._wake()

    def remove(self, task: str) -> None:
        with self._lock:
            self._channels.pop(task, None)
            self._changed.add(task)
        self._wake()

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def leftovers(self) -> Iterator[Received]:
        """After ``stop``: what was read but not taken yet (late lines, a task_files in flight), in order;
        a channel that came up too late is closed."""
        while True:
            try:
                item = self.out.get_nowait()
            except queue.Empty:
                if not self.spill:
                    return
                item = self.spill.pop(0)
            if isinstance(item, ChannelReady):
                if item.channel is not None:
                    item.channel.close()
                continue
            yield item

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is awake already
            os.write(self._wake_w, b"x")

    def _put(self, items: list[Received], stamp: float) -> None:
        """Queue what was read, in order; never drop it (on stop it is kept in ``spill`` for the last drain)."""
        while items:
            try:
                self.out.put_many(items, timeout=0.5, stamp=stamp)
                return
            except queue.Full:
                if self._stopping:
                    self.spill.extend(items)
                    return

    # --- the selector (pump thread only) ----------------------------------------------------------

    def _sync(self, task: str, chan: Channel | None) -> None:
        """Register exactly the descriptors ``chan`` reads from now (none when it is gone)."""
        want: tuple[int, ...] = ()
        if chan is not None:
            try:
                want = tuple(chan.filenos())
            except Exception:  # a broken channel: its next read says why
                want = ()
        have = self._registered.get(task, ())
        if want == have:
            return
        for fd in have:
            if fd not in want:
                self._unregister(fd, task)
        for fd in want:
            if fd in have:
                continue
            key = self._sel.get_map().get(fd)
            if key is not None:  # a stale registration: its channel was closed and the number reused
                self._unregister(fd, key.data)
            try:
                self._sel.register(fd, selectors.EVENT_READ, task)
            except (OSError, ValueError):  # closed under us: the periodic sync drops it
                continue
        self._registered[task] = tuple(fd for fd in want if self._sel.get_map().get(fd) is not None)
        if not self._registered[task]:
            del self._registered[task]

    def _unregister(self, fd: int, task: str) -> None:
        key = self._sel.get_map().get(fd)
        if key is not None and key.data == task:  # not a number another channel has taken since
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(fd)
        left = tuple(x for x in self._registered.get(task, ()) if x != fd)
        if left:
            self._registered[task] = left
        else:
            self._registered.pop(task, None)

    def _apply_changes(self, everything: bool) -> None:
        with self._lock:
            names = set(self._channels) | set(self._registered) if everything else self._changed
            todo = [(t, self._channels.get(t)) for t in names]
            self._changed = set()
        for task, chan in todo:
            self._sync(task, chan)

    def _read(self, task: str) -> Received | None:
        with self._lock:
            chan = self._channels.get(task)
        if chan is None:
            self._sync(task, None)
            return None
        self.reading_since = self.clock()
        try:
            out, err, eof = chan.read()
        except Exception as exc:  # a broken channel is an EOF with a reason
            out, err, eof = b"", f"channel error: {exc}\n".encode(), True
        finally:
            self.reading_since = None
        if eof:
            self.remove(task)
            self._sync(task, None)
        else:
            self._sync(task, chan)
        return Received(task, out, err, eof) if out or err or eof else None

    def run(self) -> None:
        next_sync = time.monotonic() + self.SYNC_S
        busy_until = 0.0  # a pass that read something: the next one starts PASS_S after it began
        try:
            while not self._stopping:
                if (rest := busy_until - time.monotonic()) > 0:
                    time.sleep(rest)  # what arrives meanwhile waits in the sockets: read in one pass
                now = time.monotonic()
                self._apply_changes(everything=now >= next_sync)
                if now >= next_sync:
                    next_sync = now + self.SYNC_S
                # Everything that arrived before ``woke`` is ready now: read in this pass. ``idle`` is set only
                # once a look finds nothing ready: set before a select that returns at once, it told the loop
                # "all read" while this thread waited for the GIL with a pass's worth of bytes unread.
                woke = self.clock()
                if not (ready := self._sel.select(0)):
                    self.idle = True
                    ready = self._sel.select(1.0)
                    self.idle = False
                stamp = self.read_through  # these bytes arrived after it: else an earlier pass read them
                batch: list[Received] = []
                size = reads = 0
                for key, _ in ready:
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                        continue
                    if self._stopping:
                        break
                    reads += 1
                    if (got := self._read(key.data)) is not None:
                        batch.append(got)
                        size += len(got.out) + len(got.err)
                        if len(batch) >= BATCH_ITEMS or size >= BATCH_BYTES:
                            self._put(batch, stamp)
                            batch, size = [], 0
                self._put(batch, stamp)
                busy_until = now + PASS_S if reads else 0.0
                self.read_through = woke
        finally:
            self._sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


def read_horizon(now: float, pump: ChannelPump, q: InputQueue, stuck_s: float) -> float:
    """The moment up to which the decision loop has taken in everything every node sent: ``now`` when
    the pump waits idle and the queue is empty; else the older of what the pump has read through and
    the oldest item still queued. A task's silence is judged up to here, not up to ``now``: a launcher
    busy with thousands of handshakes (a loop that lags, a pump the GIL starves, a full queue that
    holds the pump back) must not call a task lost whose heartbeat it has not read yet; a dead task's
    silence still grows as the loop catches up, so it is found late by the launcher's lag, not never.
    One thing is not forgiven past ``stuck_s`` (the supervisor: 3 heartbeat timeouts): a pump stuck
    inside one channel's read (a bug, a channel that blocks) cannot hide every other task's death for ever."""
    seen = now if pump.idle else pump.read_through
    stuck = pump.reading_since
    if stuck is not None and now - stuck > stuck_s:
        seen = max(seen, now - stuck_s)
    oldest = q.oldest()
    if oldest is not None:
        seen = min(seen, oldest)
    return min(seen, now)
