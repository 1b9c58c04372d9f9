"""Progress records from a training process to worker_entry (standard library only).

Records are newline-delimited JSON objects written to the pipe fd named by ``TFCLUSTER_PROGRESS_FD``
(see docs/architecture.md, "Progress records"). The writer never blocks and never raises into the
user's code: a full pipe drops the record (counters are cumulative, so nothing is lost for good), a
closed pipe disables the writer, and without the variable everything is a no-op.

``report_step`` and ``report_loss`` are for custom training loops; ``keras_callback.progress_callback()`` returns a Keras
callback built against whichever Keras the program uses. ``report_evaluation`` sends one evaluation's
metrics (the instrumentation calls it for every ``model.evaluate`` of an evaluator task).
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..protocol.env import Env
from ..protocol.metrics import CHECKPOINT_MAX, METRIC_LIMIT, METRIC_NAME_MAX, METRICS_MAX
from .loss import book as loss_book

ENV_FD = Env.PROGRESS_FD
# A record no longer than PIPE_BUF is written atomically: whole or not at all (POSIX).
MAX_RECORD_BYTES = 4096
MIN_INTERVAL_S = 0.25  # at most ~4 progress records per second
ENV_PROFILE_INTERVAL = Env.PROFILE_INTERVAL_S


def warn_once(key: str, message: str, _seen: set[str] = set()) -> None:  # noqa: B006 - process-wide memo
    """Print one ``tfcluster:`` warning line on stderr per key; never raises."""
    if key in _seen:
        return
    _seen.add(key)
    try:
        sys.stderr.write(f"tfcluster: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def profile_interval_from_env(env: Mapping[str, str] = os.environ) -> float:
    """``TFCLUSTER_PROFILE_INTERVAL_S``: the window of ``profile`` records (step clock or profiler)
    in seconds; 0 (off) when unset, invalid or not positive."""
    raw = (env.get(ENV_PROFILE_INTERVAL) or "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        warn_once("profile-interval", f"{ENV_PROFILE_INTERVAL}={raw!r} is not a number; profile records off")
        return 0.0
    return value if value > 0 else 0.0


class ProgressWriter:
    """Writes records to one fd with non-blocking, all-or-nothing writes."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        if fd is not None:
            try:
                os.set_blocking(fd, False)
            except OSError as exc:
                warn_once("progress-fd", f"progress fd {fd} unusable ({exc}); progress records disabled")
                self._fd = None

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, kind: str, **fields: Any) -> bool:
        """Write one record; True if written. Never raises."""
        if self._fd is None:
            return False
        try:
            record = {"kind": kind, "ts": time.time(), **fields}
            data = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        except (TypeError, ValueError) as exc:
            warn_once(f"progress-encode-{kind}", f"dropping unencodable {kind} record: {exc}")
            return False
        if len(data) > MAX_RECORD_BYTES:
            self.dropped += 1
            return False
        with self._lock:
            fd = self._fd
            if fd is None:
                return False
            try:
                os.write(fd, data)
            except BlockingIOError:
                self.dropped += 1  # pipe full: the reader is slow; cumulative counters catch up later
                return False
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EBADF):
                    self._fd = None  # reader gone: stop trying
                else:
                    self.dropped += 1
                return False
            self.written += 1
            return True


_writer: ProgressWriter | None = None
_writer_key: tuple[int, str | None] | None = None
_writer_lock = threading.Lock()


def get_writer(env: Mapping[str, str] | None = None) -> ProgressWriter:
    """The process-wide writer for ``TFCLUSTER_PROGRESS_FD`` (re-read after fork or env change)."""
    global _writer, _writer_key
    env = os.environ if env is None else env
    raw = env.get(ENV_FD)
    key = (os.getpid(), raw)
    with _writer_lock:
        if _writer is None or _writer_key != key:
            fd: int | None = None
            if raw:
                try:
                    fd = int(raw)
                except ValueError:
                    warn_once("progress-fd-parse", f"{ENV_FD}={raw!r} is not an fd; progress records disabled")
            _writer, _writer_key = ProgressWriter(fd), key
        return _writer


def emit(kind: str, **fields: Any) -> bool:
    """Emit one record through the process-wide writer. Never raises."""
    try:
        return get_writer().emit(kind, **fields)
    except Exception as exc:  # pragma: no cover - defensive: user code must never see our errors
        warn_once("progress-emit", f"progress record failed: {exc!r}")
        return False


#: Who counts a phase's steps when several sources report them: the step clock's stamps (steps
#: derived from the gradient all-reduces) outrank the Keras callback, an explicit ``report_step``
#: outranks both. A lower source still sets the epoch (and the callback the batch size).
SOURCES = {"callback": 0, "stamps": 1, "coordinator": 1, "user": 2}  # coordinator: a PS chief's schedules


class StepCounter:
    """Cumulative counters for one phase, emitting rate-limited ``progress`` records.

    ``step_time_s`` is the wall time of the current window divided by the steps in it; a window runs
    from ``begin()`` (or the previous record) to the record being written.
    """

    def __init__(self, phase: str, min_interval_s: float = MIN_INTERVAL_S, clock=time.monotonic) -> None:
        self.phase = phase
        self.min_interval_s = min_interval_s
        self._clock = clock
        self.steps = 0
        self.examples: int | None = None
        self.epoch = 0
        self._window_start: float | None = None
        self._window_steps = 0
        self._last_emit = -float("inf")
        self._emitted = 0  # steps in the last record
        self.owner: str | None = None  # the source whose counts are used (see SOURCES)
        self._coordinated = (0, 0)  # steps and examples counted from a PS coordinator's schedules
        self.examples_per_step: int | None = None  # hint from the Keras callback (global batch size)
        self._at: float | None = None  # wall time of the last counted step's end, when its source knows it

    def claim(self, source: str) -> None:
        """``source`` will count this phase's steps (if it outranks the current owner): claimed by the
        step clock when its first function is traced, before any step could be counted twice."""
        if self.owner is None or SOURCES.get(source, 2) > SOURCES.get(self.owner, 2):
            self.owner = source

    def begin(self) -> None:
        """Mark the start of a step if no window is open (so idle time before it is not counted)."""
        if self._window_start is None:
            self._window_start = self._clock()

    def add(
        self,
        steps: int = 1,
        examples: int | None = None,
        epoch: int | None = None,
        source: str = "user",
        at: float | None = None,
    ) -> bool:
        """Count steps; emit a record when the rate limit allows. True if a record was written.
        A ``source`` ranked below the current owner only updates the epoch. ``at``: the wall time the
        last of these steps ended (the step clock knows it; a poll comes later), the record's time."""
        if epoch is not None:
            self.epoch = int(epoch)
        rank = SOURCES.get(source, 2)
        if self.owner is not None and rank < SOURCES.get(self.owner, 2):
            return False
        if self.owner == "coordinator" and source != "coordinator":
            # the script reports its own steps after all (report_step after each join): the schedules the
            # coordinator hook counted until now are those very steps, counted again otherwise
            self.steps = max(0, self.steps - self._coordinated[0])
            if self.examples is not None:
                self.examples = max(0, self.examples - self._coordinated[1])
            self._window_steps = max(0, self._window_steps - self._coordinated[0])
            self._coordinated = (0, 0)
        elif source == "coordinator":
            self._coordinated = (self._coordinated[0] + int(steps), self._coordinated[1] + int(examples or 0))
        self.owner = source
        if examples is None and self.examples_per_step and source == "stamps":
            examples = self.examples_per_step * int(steps)
        self._at = at  # the record that counts these steps carries their time (None: when it is written)
        if self._window_start is None:
            self._window_start = self._clock()
            if source == "stamps":  # counted by a poll: their duration is unknown, keep them out of the window
                self.steps += int(steps)
                if examples is not None:
                    self.examples = (self.examples or 0) + int(examples)
                return False
        steps = int(steps)
        self.steps += steps
        self._window_steps += steps
        if examples is not None:
            self.examples = (self.examples or 0) + int(examples)
        if self._clock() - self._last_emit < self.min_interval_s:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Emit a record for the open window now (if it has steps, or the training loss moved on)."""
        loss = loss_book.totals() if self.phase == "train" else None
        stepped = self._window_steps > 0 or self.steps != self._emitted
        if not stepped and (loss is None or loss["last"] is None):
            return False
        now = self._clock()
        step_time = None
        if self._window_steps > 0 and self._window_start is not None:
            step_time = round((now - self._window_start) / self._window_steps, 6)
        self._last_emit = now
        self._window_start = now
        self._window_steps = 0
        self._emitted = self.steps
        # the last step's end when its source knows it (a record for the loss alone: now)
        when = {"ts": self._at} if self._at is not None and stepped else {}
        if loss is not None:
            when["loss"] = loss
        return emit(
            "progress",
            **when,
            steps=self.steps,
            epoch=self.epoch,
            examples=self.examples,
            step_time_s=step_time,
            phase=self.phase,
        )

    def settle(self, at: float) -> bool:
        """The steps counted so far were done at ``at`` (a PS coordinator's ``join``): a record now, with
        that time, so the training's end is the last step's, not the last count's."""
        if not self.steps:
            return False
        self._at = at
        self._emitted = -1  # a record even when these steps were reported already
        return self.flush()

    def reset_window(self) -> None:
        """Forget the open window (e.g. between epochs) without touching the cumulative counters."""
        self._window_start = None
        self._window_steps = 0


_counters: dict[str, StepCounter] = {}
_counters_lock = threading.Lock()


def counter(phase: str = "train") -> StepCounter:
    """The process-wide counter of a phase (``train``, ``test`` or ``predict``)."""
    with _counters_lock:
        c = _counters.get(phase)
        if c is None:
            c = _counters[phase] = StepCounter(phase)
        return c


def report_step(steps: int = 1, examples: int | None = None, epoch: int | None = None, phase: str = "train") -> None:
    """Report finished training steps from a custom loop (cheap; safe to call every step).

    ``examples`` is the number of examples those steps consumed (global batch size times steps if you want
    cluster-wide throughput); ``epoch`` the current epoch if known. Records are cumulative and written
    at most ~4 times per second; without ``TFCLUSTER_PROGRESS_FD`` this does nothing.
    """
    try:
        if not get_writer().enabled:
            return
        counter(phase).add(steps, examples, epoch)
    except Exception as exc:  # never break the training loop
        warn_once("report-step", f"report_step failed: {exc!r}")


def report_loss(value: Any, steps: int = 1) -> None:
    """Report the training loss of the step(s) just done, from a custom loop (cheap; safe every step).

    ``value``: the loss as the step returns it — a float, a NumPy or TensorFlow scalar (a tensor is read
    only when a record is written, so calling this every step adds no sync), after ``strategy.reduce``
    (not a per-replica value). ``steps``: the steps it stands for (a mean over several). It outranks
    the loss the instrumentation finds by itself. Without ``TFCLUSTER_PROGRESS_FD`` this does nothing.
    """
    try:
        if not get_writer().enabled:
            return
        if type(value).__name__ == "PerReplica":
            warn_once("report-loss-replica", "report_loss: pass the loss after strategy.reduce, not per replica")
            return
        loss_book.add(value, "user", steps)
    except Exception as exc:  # never break the training loop
        warn_once("report-loss", f"report_loss failed: {exc!r}")


def flush() -> None:
    """Write the pending counts of every phase now (e.g. at the end of training)."""
    try:
        with _counters_lock:
            counters = list(_counters.values())
        for c in counters:
            c.flush()
    except Exception as exc:
        warn_once("progress-flush", f"progress flush failed: {exc!r}")


# ------------------------------------------------------------------------------------ evaluations


def _metric(value: Any) -> float | None:
    """A metric's value as a finite float (a Python or NumPy number, a scalar tensor), else None."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        value = value.numpy() if hasattr(value, "numpy") else value
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return number if math.isfinite(number) and abs(number) <= METRIC_LIMIT else None


def metric_values(logs: Any) -> tuple[dict[str, float], int]:
    """The metrics of ``logs`` (name -> value) the protocol carries: at most ``METRICS_MAX``, names of 1 to
    ``METRIC_NAME_MAX`` characters, finite numbers; and how many were left out."""
    out: dict[str, float] = {}
    dropped = 0
    for name, value in logs.items() if isinstance(logs, Mapping) else ():
        number = _metric(value)
        if (
            not isinstance(name, str)
            or not 0 < len(name) <= METRIC_NAME_MAX
            or number is None
            or len(out) >= METRICS_MAX
        ):
            dropped += 1
            continue
        out[name] = number
    return out, dropped


_evaluated = {"count": 0, "checkpoint": None}


def note_checkpoint(path: Any) -> None:
    """The checkpoint the next evaluation evaluates (``SidecarEvaluator`` names it as it loads it)."""
    _evaluated["checkpoint"] = None if path is None else str(path)


def report_evaluation(
    metrics: Any, step: int | None = None, checkpoint: str | None = None, source: str | None = None
) -> bool:
    """Report one evaluation: its metrics (name -> number, e.g. what ``model.evaluate(...,
    return_dict=True)`` returns), the training step and checkpoint it evaluated, if known (else the one
    ``note_checkpoint`` named). Metrics beyond the bounds are dropped with one warning. Never raises."""
    try:
        values, dropped = metric_values(metrics)
        if dropped:
            warn_once(
                "eval-dropped",
                f"evaluation: {dropped} metric(s) left out of the report (at most {METRICS_MAX}, "
                f"names of 1 to {METRIC_NAME_MAX} characters, finite numbers only)",
            )
        noted, _evaluated["checkpoint"] = _evaluated["checkpoint"], None
        checkpoint = checkpoint if checkpoint is not None else noted
        _evaluated["count"] += 1
        fields: dict[str, Any] = {
            "count": _evaluated["count"],
            "metrics": values,
            "dropped": dropped,
            "source": source or ("sidecar" if noted is not None else "evaluate"),
        }
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            fields["step"] = step
        if checkpoint:
            fields["checkpoint"] = str(checkpoint)[-CHECKPOINT_MAX:]  # the tail names it
        if emit("evaluation", **fields):
            return True
        if get_writer().enabled:
            warn_once("eval-unsent", "evaluation: a report could not be sent (too large, or the pipe was full)")
        return False
    except Exception as exc:  # never break the evaluation loop
        warn_once("report-evaluation", f"report_evaluation failed: {exc!r}")
        return False
