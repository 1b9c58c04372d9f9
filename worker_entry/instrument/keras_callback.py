"""The Keras callback that reports epochs, examples and steps to worker_entry during ``fit``.

Built once per Keras ``Callback`` base class (tf_keras, Keras 2 or Keras 3), so it works with
whichever Keras the program uses. ``progress.py`` (records, counters) stays free of TensorFlow.

Under a multi-worker MWMS the step clock's stamps (``stamps.py``) count the training steps and produce
the straggler signals by themselves; the callback then adds what only Keras knows — the epoch and the
global batch size (examples), the training loss of its batch logs (``loss.py``) — and counts the
evaluate/predict phases. Without stamps (one worker, no
MWMS) it counts the training steps too. With ``TFCLUSTER_PROFILER=1`` it drives the TF-profiler sampler.

The evaluation callback (added to every ``model.evaluate`` of an evaluator task) reports the metrics
``evaluate`` computed — the very dict it hands its callbacks' ``on_test_end`` and returns with
``return_dict=True`` — with the training step of the weights it evaluated (the optimizer's iterations,
restored from the checkpoint).
"""

from __future__ import annotations

from typing import Any

from .loss import book as loss_book
from .loss import keras_logged_scale
from .progress import counter, flush, get_writer, report_evaluation, warn_once

_callback_classes: dict[int, type] = {}
_evaluation_classes: dict[int, type] = {}


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
    """A Keras callback reporting train/test/predict steps, epochs and examples.

    ``batch_size`` is the global batch size (examples per step across all replicas) if known; the
    records then carry cumulative ``examples``. The straggler signals come from the step clock without
    any callback; with ``TFCLUSTER_PROFILER=1`` this callback drives the TF-profiler sampler instead
    (``profile=False`` or ``tf_profiler=False``, when another callback profiles, keep it off).
    """
    return callback_class(base)(batch_size=batch_size, profile=profile, tf_profiler=tf_profiler)


def _build_callback_class(base: type) -> type:
    class ProgressCallback(base):  # type: ignore[misc, valid-type]
        """Reports epochs, examples and steps to worker_entry (the step clock's stamps outrank its steps)."""

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
            self._loss_scale = 1.0

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
            counter(phase).add(steps, self._examples(steps), self._epoch, source="callback")
            return steps

        # -- train
        def on_train_begin(self, logs=None) -> None:
            try:
                self._loss_scale = keras_logged_scale(getattr(self, "model", None))
                if self.batch_size:
                    counter("train").examples_per_step = int(self.batch_size)
                if self.profile and self.tf_profiler and self._sampler is None and get_writer().enabled:
                    from .profiler.sampler import ProfileSampler

                    sampler = ProfileSampler.from_env()  # only with TFCLUSTER_PROFILER=1
                    self._sampler = sampler if sampler.enabled else None
            except Exception as exc:
                warn_once("sampler-init", f"profiler sampling disabled: {exc!r}")
                self._sampler = None

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self._epoch = int(epoch)
            self._last_batch.pop("train", None)

        def on_train_batch_begin(self, batch, logs=None) -> None:
            try:
                if self._sampler is not None:
                    self._sampler.on_batch_begin()
                counter("train").begin()
            except Exception as exc:
                warn_once("cb-train-begin", f"progress callback error: {exc!r}")

        def on_train_batch_end(self, batch, logs=None) -> None:
            try:
                if isinstance(logs, dict) and logs.get("loss") is not None:  # a tensor: read when a record goes
                    loss_book.keras(logs["loss"], int(batch), self._epoch, self._loss_scale)
                steps = self._steps_since("train", int(batch))
                if self._sampler is not None:
                    self._sampler.on_batch_end(steps)
                counter("train").add(steps, self._examples(steps), self._epoch, source="callback")
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


def evaluation_callback_class(base: type | None = None) -> type:
    """The EvaluationCallback class derived from ``base`` (a Keras ``Callback`` class), built once."""
    base = base or _default_callback_base()
    cls = _evaluation_classes.get(id(base))
    if cls is None:

        class EvaluationCallback(base):  # type: ignore[misc, valid-type]
            """Reports each evaluation's metrics (``on_test_end``'s logs) and the step it evaluated."""

            _tfcluster_evaluation = True  # marker: the instrumentation adds no second one

            def on_test_end(self, logs=None) -> None:
                report_evaluation(logs or {}, step=_iterations(getattr(self, "model", None)))

        EvaluationCallback.__qualname__ = "EvaluationCallback"
        EvaluationCallback.__module__ = __name__
        cls = _evaluation_classes[id(base)] = EvaluationCallback
    return cls


def _iterations(model: Any) -> int | None:
    """The optimizer's iterations: the training step of the weights a model holds (restored with them)."""
    try:
        iterations = model.optimizer.iterations
        value = iterations.numpy() if hasattr(iterations, "numpy") else iterations
        return int(value)
    except Exception:  # no optimizer (not compiled for training), or not readable: no step
        return None
