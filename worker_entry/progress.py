"""Progress records from a training process to worker_entry (standard library only).

Records are newline-delimited JSON objects written to the pipe fd named by ``TFCLUSTER_PROGRESS_FD``
(see docs/architecture.md, "Progress records"). The writer never blocks and never raises into the
user's code: a full pipe drops the record (counters are cumulative, so nothing is lost for good), a
closed pipe disables the writer, and without the variable everything is a no-op.

``report_step`` is for custom training loops; ``progress_callback()`` returns a Keras callback built
against whichever Keras the program uses.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

ENV_FD = "TFCLUSTER_PROGRESS_FD"
# A record no longer than PIPE_BUF is written atomically: whole or not at all (POSIX).
MAX_RECORD_BYTES = 4096
MIN_INTERVAL_S = 0.25  # at most ~4 progress records per second
ENV_PROFILE_INTERVAL = "TFCLUSTER_PROFILE_INTERVAL_S"


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

    def begin(self) -> None:
        """Mark the start of a step if no window is open (so idle time before it is not counted)."""
        if self._window_start is None:
            self._window_start = self._clock()

    def add(self, steps: int = 1, examples: int | None = None, epoch: int | None = None) -> bool:
        """Count steps; emit a record when the rate limit allows. True if a record was written."""
        if self._window_start is None:
            self._window_start = self._clock()
        if epoch is not None:
            self.epoch = int(epoch)
        steps = int(steps)
        self.steps += steps
        self._window_steps += steps
        if examples is not None:
            self.examples = (self.examples or 0) + int(examples)
        if self._clock() - self._last_emit < self.min_interval_s:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Emit a record for the open window now (if it has steps)."""
        if self._window_steps <= 0 or self._window_start is None:
            return False
        now = self._clock()
        step_time = (now - self._window_start) / self._window_steps
        self._last_emit = now
        self._window_start = now
        self._window_steps = 0
        return emit(
            "progress",
            steps=self.steps,
            epoch=self.epoch,
            examples=self.examples,
            step_time_s=round(step_time, 6),
            phase=self.phase,
        )

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


def flush() -> None:
    """Write the pending counts of every phase now (e.g. at the end of training)."""
    try:
        with _counters_lock:
            counters = list(_counters.values())
        for c in counters:
            c.flush()
    except Exception as exc:
        warn_once("progress-flush", f"progress flush failed: {exc!r}")


# --------------------------------------------------------------------------------------------- Keras

_callback_classes: dict[int, type] = {}


def _default_callback_base() -> type:
    """``tf.keras.callbacks.Callback``: tf_keras under TF_USE_LEGACY_KERAS=1, else Keras 3."""
    import tensorflow as tf  # lazy: progress.py must import without TensorFlow

    return tf.keras.callbacks.Callback


def callback_class(base: type | None = None) -> type:
    """The ProgressCallback class derived from ``base`` (a Keras ``Callback`` class), built once."""
    base = base or _default_callback_base()
    cls = _callback_classes.get(id(base))
    if cls is None:
        cls = _callback_classes[id(base)] = _build_callback_class(base)
    return cls


def progress_callback(
    batch_size: int | None = None, profile: bool = True, base: type | None = None, tf_profiler: bool = True
) -> Any:
    """A Keras callback reporting train/test/predict steps and the straggler signals (``profile`` records).

    ``batch_size`` is the global batch size (examples per step across all replicas) if known; the
    records then carry cumulative ``examples``. ``profile=False`` turns the straggler signals off.
    The signals come from the step clock (``stepclock.py``), or with ``TFCLUSTER_PROFILER=1`` from the
    TF-profiler sampler (``profiling.py``); ``tf_profiler=False`` (another callback profiles) keeps
    the latter off.
    """
    return callback_class(base)(batch_size=batch_size, profile=profile, tf_profiler=tf_profiler)


def _build_callback_class(base: type) -> type:
    class ProgressCallback(base):  # type: ignore[misc, valid-type]
        """Reports steps to worker_entry; drives the straggler signals (step clock) during training."""

        _tfcluster_progress = True  # marker: the instrumentation adds no second one

        def __init__(self, batch_size: int | None = None, profile: bool = True, tf_profiler: bool = True) -> None:
            super().__init__()
            # Keep Keras from converting the logs to numpy for us: that would force a sync per step.
            self._supports_tf_logs = True
            self.batch_size = batch_size
            self.profile = profile
            self.tf_profiler = tf_profiler
            self._epoch = 0
            self._last_batch: dict[str, int] = {}
            self._sampler = None

        # -- helpers
        def _examples(self, steps: int) -> int | None:
            return None if not self.batch_size else int(self.batch_size) * steps

        def _steps_since(self, phase: str, batch: int) -> int:
            # With steps_per_execution > 1 Keras calls the hooks once per execution with the index of
            # the last step in it: count the difference, not the calls.
            last = self._last_batch.get(phase, -1)
            self._last_batch[phase] = batch
            return batch - last if batch > last else 1

        def _batch_end(self, phase: str, batch: int) -> int:
            steps = self._steps_since(phase, int(batch))
            counter(phase).add(steps, self._examples(steps), self._epoch)
            return steps

        # -- train
        def on_train_begin(self, logs=None) -> None:
            try:
                if self.profile and self._sampler is None and get_writer().enabled:
                    from .stepclock import sampler_from_env

                    self._sampler = sampler_from_env(tf_profiler=self.tf_profiler)
            except Exception as exc:
                warn_once("sampler-init", f"straggler signals disabled: {exc!r}")
                self._sampler = None

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self._epoch = int(epoch)
            self._last_batch.pop("train", None)

        def on_train_batch_begin(self, batch, logs=None) -> None:
            try:
                if self._sampler is not None:
                    self._sampler.on_batch_begin()  # first: the step clock's stamp of the step start
                counter("train").begin()
            except Exception as exc:
                warn_once("cb-train-begin", f"progress callback error: {exc!r}")

        def on_train_batch_end(self, batch, logs=None) -> None:
            try:
                steps = self._steps_since("train", int(batch))
                if self._sampler is not None:
                    self._sampler.on_batch_end(steps)  # first: the step clock's stamp of the step end
                counter("train").add(steps, self._examples(steps), self._epoch)
            except Exception as exc:
                warn_once("cb-train-end", f"progress callback error: {exc!r}")

        def on_epoch_end(self, epoch, logs=None) -> None:
            try:
                counter("train").flush()
                counter("train").reset_window()
            except Exception as exc:
                warn_once("cb-epoch-end", f"progress callback error: {exc!r}")

        def on_train_end(self, logs=None) -> None:
            try:
                if self._sampler is not None:
                    self._sampler.close()
                    self._sampler = None
                flush()
            except Exception as exc:
                warn_once("cb-train-end-all", f"progress callback error: {exc!r}")

        # -- evaluate / predict (also the validation inside fit)
        def on_test_begin(self, logs=None) -> None:
            self._last_batch.pop("test", None)
            counter("test").reset_window()

        def on_test_batch_begin(self, batch, logs=None) -> None:
            counter("test").begin()

        def on_test_batch_end(self, batch, logs=None) -> None:
            try:
                self._batch_end("test", batch)
            except Exception as exc:
                warn_once("cb-test", f"progress callback error: {exc!r}")

        def on_test_end(self, logs=None) -> None:
            counter("test").flush()

        def on_predict_begin(self, logs=None) -> None:
            self._last_batch.pop("predict", None)
            counter("predict").reset_window()

        def on_predict_batch_begin(self, batch, logs=None) -> None:
            counter("predict").begin()

        def on_predict_batch_end(self, batch, logs=None) -> None:
            try:
                self._batch_end("predict", batch)
            except Exception as exc:
                warn_once("cb-predict", f"progress callback error: {exc!r}")

        def on_predict_end(self, logs=None) -> None:
            counter("predict").flush()

    ProgressCallback.__qualname__ = "ProgressCallback"
    ProgressCallback.__module__ = __name__
    return ProgressCallback
