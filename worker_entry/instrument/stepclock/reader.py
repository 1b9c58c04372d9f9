"""The step clock's reader: a daemon thread in the training process that turns stamp rows into
progress (``steps``, examples) and, every ``TFCLUSTER_PROFILE_INTERVAL_S``, one ``profile`` record.

No framework callback is involved: it works for Keras ``fit`` and any custom loop alike. Every
``POLL_S`` it takes the rows the graph wrote (``stampring.drain``: a read of two small variables per
replica), walks each replica's timeline (``stepclock.Timeline``) and counts the steps it closed.
Per window it emits the record of the replica that worked longest between all-reduces (the one its
worker's collectives wait for). It stops at interpreter exit after a last read. Any failure prints one
``tfcluster:`` warning and stops the reader; training is never affected.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .. import progress
from ..loss import LossBook
from ..loss import book as loss_book
from ..progress import warn_once
from . import gradnorms
from . import ring as stampring
from .ring import COLLECTIVE
from .timeline import DEFAULT_MIN_STEPS, MAX_WINDOW, StepSplit, Timeline, median_batch, noise, summarize

POLL_S = 0.5


class Reader:
    """Rows → steps → progress and profile records. ``poll()`` does one round (tests drive it)."""

    def __init__(
        self,
        interval_s: float,
        min_steps: int = DEFAULT_MIN_STEPS,
        take: Callable[[], list[stampring.Row]] = stampring.drain,
        take_inputs: Callable[[], list[tuple[float, float]]] = stampring.take_inputs,
        primaries: Callable[[int], frozenset[int]] = stampring.primary_calls,
        has_runs: Callable[[int], bool] = stampring.has_runs,
        wire: Callable[[int], dict[str, Any] | None] = stampring.step_wire,
        solo: Callable[[int], bool] = stampring.is_solo,
        loss_call: Callable[[int], int | None] = stampring.loss_call,
        step_noise: Callable[[int], tuple[int, str | None]] = stampring.step_noise,
        losses: LossBook = loss_book,
        emit: Callable[..., Any] = progress.emit,
        count: Callable[..., Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        stamps: str = "auto",
    ) -> None:
        self.interval_s = interval_s
        self.min_steps = max(1, int(min_steps))
        self._take, self._take_inputs = take, take_inputs
        self._primaries, self._has_runs = primaries, has_runs
        self._wire, self._solo = wire, solo
        self._loss_call, self._step_noise, self._losses = loss_call, step_noise, losses
        self._loss_at: tuple[str, float, int] | None = None  # the loss book at the last window's end
        self._examples = 0.0  # examples of closed steps not counted yet (fractions carried over)
        self._emit = emit
        self._count = count or (
            lambda n, examples, at: progress.counter("train").add(n, examples, source="stamps", at=at)
        )
        self._clock, self._cpu = clock, cpu
        self.stamps = stamps
        self.timelines: dict[int, Timeline] = {}
        self.windows: dict[int, deque[StepSplit]] = {}
        self.steps = 0
        self._window_steps = 0
        self._window_start = clock()
        self._cpu0 = cpu()
        self.records = 0
        self.last_record: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def poll(self, wait_s: float = -1, *, final: bool = False) -> int:
        """One round: take rows, count steps, emit a window record when due. Returns steps counted
        (0 when another round holds the lock longer than ``wait_s``; -1 waits as long as it takes).
        ``final`` (the process exits): the last window is written once it has ``min_steps``, due or
        not — a job shorter than one window still gets its step split."""
        if not self._lock.acquire(timeout=wait_s):
            return 0
        try:
            rows = self._take()
            inputs = self._take_inputs()
            by_replica: dict[int, list[stampring.Row]] = {}
            for r in rows:
                by_replica.setdefault(r.replica, []).append(r)
            for replica in by_replica:
                self.timelines.setdefault(replica, Timeline(self._primaries, self._has_runs, self._solo))
            if by_replica:
                self._take_losses(by_replica[min(by_replica)])
            closed: dict[int, list[StepSplit]] = {}
            for replica, timeline in self.timelines.items():
                closed[replica] = timeline.feed(by_replica.get(replica, ()), inputs)
                window = self.windows.setdefault(replica, deque(maxlen=MAX_WINDOW))
                window.extend(s for s in closed[replica] if not s.warmup)
            counting = min(closed) if closed else None  # the lowest replica counts the worker's steps
            n = len(closed[counting]) if counting is not None else 0
            examples = self._take_examples(closed, n > 0)
            if n:
                self.steps += n
                self._window_steps += n
                # the record's time is the last step's end (its all-reduce's exit, the same moment on every
                # worker of a synchronous job), not this poll's: the launcher's rates need no guessing
                self._count(n, examples, closed[counting][-1].end)
            due = self._clock() - self._window_start >= self.interval_s
            if self.interval_s > 0 and self._window_steps >= self.min_steps and (due or final):
                self._flush()
            return n
        finally:
            self._lock.release()

    def _take_examples(self, closed: dict[int, list[StepSplit]], counting: bool) -> int | None:
        """The worker's examples of the steps closed now: the sum over its local replicas (each step of
        a replica carries its batch x replicas in sync / local replicas), whole examples only (the
        fraction, and a replica's steps closed before the counting replica's, wait for the next count);
        None when a step's examples are unknown."""
        steps = [s for ss in closed.values() for s in ss]
        if any(s.examples is None for s in steps):
            self._examples = 0.0
            return None
        self._examples += sum(s.examples or 0.0 for s in steps)
        if not counting:
            return None
        whole = int(self._examples + 1e-6)
        self._examples = max(0.0, self._examples - whole)
        return whole

    def _take_losses(self, rows: list[stampring.Row]) -> None:
        """The loss the step function returns (one local replica's rows: every replica has the same)."""
        for r in rows:
            if r.code == COLLECTIVE and self._loss_call(r.fn) == r.call:
                self._losses.add(r.c, "stamps")

    def _noise(self, fns: list[int]) -> dict[str, Any] | None:
        """The window's noise-scale inputs (``protocol.GradNoise``), with its loss and the worker's steps."""
        found = noise([list(w) for w in self.windows.values() if w])
        at = self._losses.snapshot()
        was = self._loss_at if self._loss_at is not None and at is not None and self._loss_at[0] == at[0] else None
        loss = None
        if at is not None and at[2] > (was[2] if was else 0):  # from the start, or the last window of its source
            loss = (at[1] - (was[1] if was else 0.0)) / (at[2] - (was[2] if was else 0))
        self._loss_at = at or self._loss_at
        if found is None:
            return None
        main = max(set(fns), key=fns.count)
        group, optimizer = self._step_noise(main)
        wire = self._wire(main) or {}
        found.update(replicas=group, sparse=int(wire.get("grad_sparse") or 0), step=self.steps)
        found["every"] = gradnorms.traced_every()  # the steps without norms are not in ``found``: sampled ones only
        if loss is not None:
            found["loss"] = loss
        if optimizer:
            found["optimizer"] = optimizer[:64]
        return found

    def _flush(self) -> None:
        cpu = self._cpu() - self._cpu0
        fns_all = [s.fn for w in self.windows.values() for s in w]
        gns = self._noise(fns_all) if fns_all else None
        best: dict[str, Any] | None = None
        for window in self.windows.values():
            if not window:
                continue
            rec = summarize(list(window), cpu_s=cpu, counted=self._window_steps)
            if best is None or rec.get("pre_collective_ms", 0) > best.get("pre_collective_ms", 0):
                fns = [s.fn for s in window]
                best = {**rec, **(self._wire(max(set(fns), key=fns.count)) or {})}  # the window's main function
        batch = median_batch(self.windows.values())
        for window in self.windows.values():
            window.clear()
        self._window_steps = 0
        self._window_start = self._clock()
        self._cpu0 = self._cpu()
        if best is not None and "step_ms" in best:
            best["stamps"] = self.stamps
            if gns is not None:
                best["noise"] = gns
            if batch is not None:
                best["batch_p50"] = batch
            self.records += 1
            self.last_record = best
            self._emit("profile", **best)


class _Thread(threading.Thread):
    def __init__(self, reader: Reader, poll_s: float) -> None:
        super().__init__(name="tfcluster-stepclock", daemon=True)
        self.reader = reader
        self.poll_s = poll_s
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.poll_s):
            if not self._round():
                return

    def _round(self, wait_s: float = -1, final: bool = False) -> bool:
        try:
            self.reader.poll(wait_s, final=final)
            return True
        except Exception as exc:
            warn_once("stepclock-reader", f"step clock reader stopped ({exc!r}); training continues")
            return False

    def finish(self) -> None:
        """At exit: stop, take what is left, write the last progress record."""
        self.stop.set()
        self.join(timeout=2.0)
        if self._round(wait_s=2.0, final=True):
            progress.flush()


_thread: _Thread | None = None
_thread_lock = threading.Lock()


def ensure_started(env: Mapping[str, str] = os.environ) -> bool:
    """Start the reader once per process (called while a stamped function is traced); only when
    progress records go somewhere."""
    global _thread
    if _thread is not None and _thread.is_alive():
        return False
    with _thread_lock:
        if _thread is not None and _thread.pid == os.getpid():  # type: ignore[attr-defined]
            return False
        if not progress.get_writer(env).enabled:
            return False
        # from now on the stamps count training steps: the Keras callback (whose first batch ends
        # after this trace) must not count them too
        progress.counter("train").claim("stamps")
        from .devsync import sync_mode

        reader = Reader(progress.profile_interval_from_env(env), stamps=sync_mode(env))
        _thread = _Thread(reader, POLL_S)
        _thread.pid = os.getpid()  # type: ignore[attr-defined]
        _thread.start()
        atexit.register(_thread.finish)
        return True


def current() -> Reader | None:
    return _thread.reader if _thread is not None else None
