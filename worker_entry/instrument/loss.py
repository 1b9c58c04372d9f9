"""The training loss for the progress records, with no edit to the script where it can be found.

Three sources, the most explicit winning (``SOURCES``):

- ``user``: ``worker_entry.progress.report_loss(value)`` from a custom loop;
- ``callback``: Keras ``fit``'s batch logs. Their ``loss`` is the running mean over the epoch so far
  (tf_keras and Keras 3 both reset their loss tracker at each epoch), so the per-step losses behind it
  are recovered exactly from consecutive means: the epoch's sum so far is mean x (batch + 1);
- ``stamps``: the scalar a custom loop's step function returns through ``strategy.reduce`` (the step
  clock finds it in the graph: ``stepclock.gradnorms.is_loss``).

Kept as cumulative sums (``protocol.LossTotals``), like the step counters: a dropped record loses
nothing and any span's mean is a difference. A tensor is not read when it is handed over — that would
wait for its step to finish (a sync per step on a GPU) — but when a record is written (≤ 4 per second),
from the thread that writes it. Standard library only; nothing here raises into user code.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from ..protocol.metrics import METRIC_LIMIT

SOURCES = {"stamps": 0, "callback": 1, "user": 2}
MAX_PENDING = 4096  # values held unread before they are read at once


def _number(value: Any) -> float | None:
    """A finite float of a Python/NumPy number or a scalar tensor (read now), else None."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return None
    try:
        value = value.numpy() if hasattr(value, "numpy") else value
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return number if math.isfinite(number) and abs(number) <= METRIC_LIMIT else None


class _Source:
    """One source's cumulative sum and steps, with its values not read yet."""

    def __init__(self) -> None:
        self.sum = 0.0
        self.steps = 0
        self.pending: list[tuple[Any, int]] = []  # (value, steps it covers)
        self.last_emitted: tuple[float, int] = (0.0, 0)

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        for value, steps in pending:
            number = _number(value)
            if number is not None:  # a non-finite loss (a diverged step) is left out of the mean
                self.sum += number * steps
                self.steps += steps


class _Epochs:
    """Keras's running means: per epoch the last (mean, batches so far), read when totals are asked for."""

    def __init__(self) -> None:
        self.closed_sum = 0.0
        self.closed_steps = 0
        self.closing: list[tuple[Any, int]] = []  # ended epochs' last means, not read yet
        self.epoch: int | None = None
        self.current: tuple[Any, int] | None = None

    def note(self, mean: Any, batches: int, epoch: int) -> None:
        if self.epoch is not None and epoch != self.epoch and self.current is not None:
            self.closing.append(self.current)
            self.current = None
        if self.current is not None and batches < self.current[1]:  # a new epoch by its batch index
            self.closing.append(self.current)
        self.epoch, self.current = epoch, (mean, batches)

    def totals(self) -> tuple[float, int]:
        closing, self.closing = self.closing, []
        for mean, n in closing:
            number = _number(mean)
            if number is not None:
                self.closed_sum += number * n
                self.closed_steps += n
        s, n = self.closed_sum, self.closed_steps
        if self.current is not None and (number := _number(self.current[0])) is not None:
            s, n = s + number * self.current[1], n + self.current[1]
        return s, n


class LossBook:
    """The process's training loss by source; ``totals()`` gives the record's ``loss`` field."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources = {name: _Source() for name in SOURCES}
        self._epochs = _Epochs()

    def add(self, value: Any, source: str = "user", steps: int = 1) -> None:
        """One loss value covering ``steps`` steps (a number or a scalar tensor, read later)."""
        with self._lock:
            src = self._sources[source]
            src.pending.append((value, max(1, int(steps))))
            if len(src.pending) >= MAX_PENDING:
                src.settle()

    def keras(self, mean: Any, batch: int, epoch: int, scale: float = 1.0) -> None:
        """Keras's logged loss after ``batch`` (0-based, the last step of an execution) of ``epoch``, times
        ``scale`` (``keras_logged_scale``)."""
        with self._lock:
            self._epochs.note(_Scaled(mean, scale) if scale != 1.0 else mean, int(batch) + 1, int(epoch))

    def snapshot(self) -> tuple[str, float, int] | None:
        """(source, sum, steps) of the most explicit source that has any, reading what is pending."""
        with self._lock:
            best = None
            for name in sorted(SOURCES, key=SOURCES.__getitem__, reverse=True):
                if name == "callback":
                    s, n = self._epochs.totals()
                    src = self._sources[name]
                    src.sum, src.steps = s, n
                else:
                    src = self._sources[name]
                    src.settle()
                if src.steps > 0 and best is None:
                    best = (name, src.sum, src.steps)
            return best

    def totals(self) -> dict[str, Any] | None:
        """The ``loss`` of a progress record: cumulative sum and steps, the mean since the last record."""
        snap = self.snapshot()
        if snap is None:
            return None
        name, s, n = snap
        with self._lock:
            src = self._sources[name]
            ps, pn = src.last_emitted
            src.last_emitted = (s, n)
        last = (s - ps) / (n - pn) if n > pn else None
        if not (abs(s) <= METRIC_LIMIT and (last is None or abs(last) <= METRIC_LIMIT)):
            return None
        return {"sum": s, "steps": n, "last": last, "source": name}


class _Scaled:
    """A value read later, times a factor."""

    def __init__(self, value: Any, scale: float) -> None:
        self.value, self.scale = value, scale

    def item(self) -> float:
        number = _number(self.value)
        return float("nan") if number is None else number * self.scale


def keras_logged_scale(model: Any) -> float:
    """What undoes tf_keras's own reduction of its logs under a multi-worker MWMS: its ``fit`` (2.21,
    ``reduce_per_replica`` with ``distribute_reduction_method`` "auto" → "sum") reduces each logged metric
    with ``strategy.reduce(SUM)`` of a value every replica already holds whole, so the logs show the loss
    times the replicas in sync (measured on the test bed: 15.2 for a loss of 5 at 3 workers). 1/N then;
    1 for every other case (one worker, "first", Keras 3)."""
    try:
        strategy = model.distribute_strategy
        extended = strategy.extended
        multi = bool(getattr(extended, "_in_multi_worker_mode", lambda: False)())
        mwms = any(c.__name__ == "CollectiveAllReduceStrategy" for c in type(strategy).__mro__)
        tf_keras = any(c.__module__.startswith(("tf_keras.", "keras.src.engine.")) for c in type(model).__mro__)
        method = getattr(model, "distribute_reduction_method", "auto")
        if multi and mwms and tf_keras and method in ("auto", "sum"):
            return 1.0 / max(1, int(strategy.num_replicas_in_sync))
    except Exception:
        pass
    return 1.0


book = LossBook()
