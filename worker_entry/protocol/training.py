"""What the training process says about its training: the progress counters, the training loss and the
gradient noise scale's inputs (the ``progress`` records and the ``noise`` of a step-clock window).

Kept apart from ``messages``: these records grow with what the instrumentation learns to measure; the
message set does not. Every numeric field has a range (``schema``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .metrics import METRIC_LIMIT
from .schema import COUNT_MAX, S_MAX, TS_MAX, Record, spec

#: Squared gradient norms are accumulated in float32 on the device: a finite one is at most float32's max.
SQ_MAX = 3.5e38
#: (Co)variances of squared norms across steps: up to SQ_MAX², within the schema's float limit.
VAR_MAX = 1.3e77
REPLICAS_MAX = 1 << 24
#: The longest sampling period of the norms (``TFCLUSTER_GRADNOISE_EVERY``): every k-th step.
EVERY_MAX = 1 << 16
#: Optimizers whose update divides the gradient by a running estimate of its second moment: the noise
#: scale reported is the plain one (of the raw gradients), not the preconditioned one they follow.
ADAPTIVE = ("adam", "adagrad", "adadelta", "rmsprop", "adafactor", "lion", "ftrl")


def adaptive(optimizer: str | None) -> bool:
    """An Adam-family (preconditioning) optimizer, by its class name (``GradNoise.optimizer``)."""
    low = (optimizer or "").lower()
    return any(a in low for a in ADAPTIVE)


@dataclass
class LossTotals(Record):
    """The training loss so far, cumulative within the process (like the step counters: a dropped record
    loses nothing, and the mean over any span is ``(sum₂ - sum₁) / (steps₂ - steps₁)``).

    ``source``: ``callback`` (Keras ``fit``'s batch logs: the per-step losses behind its running mean),
    ``user`` (``worker_entry.progress.report_loss``), ``stamps`` (the scalar a custom loop's step function
    returns through ``strategy.reduce``). ``last``: the mean over the steps since the previous record."""

    sum: float = field(metadata=spec(lo=-METRIC_LIMIT, hi=METRIC_LIMIT))
    steps: int = field(metadata=spec(lo=1, hi=COUNT_MAX))
    last: float | None = field(default=None, metadata=spec(lo=-METRIC_LIMIT, hi=METRIC_LIMIT))
    source: str = field(default="user", metadata=spec(max_len=16))


@dataclass
class Progress(Record):
    """The training process's cumulative counters (its last progress record)."""

    steps: int = field(metadata=spec(lo=0, hi=COUNT_MAX))
    epoch: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))
    examples: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    step_time_s: float | None = field(default=None, metadata=spec(lo=0, hi=S_MAX))
    phase: str = field(default="train", metadata=spec(max_len=32))
    ts: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))
    loss: LossTotals | None = None


@dataclass
class GradNoise(Record):
    """One step-clock window's inputs to the gradient noise scale (McCandlish et al. 2018, appendix A),
    from one worker: per step, ``local_sq`` = the mean over its replicas of |g_i|² (each replica's
    gradient before the all-reduce) and ``total_sq`` = |R/d|² (the reduced gradient, d = the group for a
    SUM); untrimmed means over the window's ``steps`` whose norms were taken (every ``every``-th step:
    ``TFCLUSTER_GRADNOISE_EVERY``) and finite, and their per-step (co)variances. ``replicas``: N, the replicas one all-reduce sums; ``batch``: examples per step
    across them (k·b·N with k micro-batches); ``sparse``: ``IndexedSlices`` tensors per step left out;
    ``nonfinite``: steps skipped. ``step``: the worker's steps at the window's end; ``loss``: its mean
    training loss over the window; ``optimizer``: the class that applied the gradients, when found."""

    steps: int = field(metadata=spec(lo=1, hi=COUNT_MAX))
    replicas: int = field(metadata=spec(lo=1, hi=REPLICAS_MAX))
    local_sq: float = field(metadata=spec(lo=0, hi=SQ_MAX))
    total_sq: float = field(metadata=spec(lo=0, hi=SQ_MAX))
    var_local: float | None = field(default=None, metadata=spec(lo=0, hi=VAR_MAX))
    var_total: float | None = field(default=None, metadata=spec(lo=0, hi=VAR_MAX))
    cov: float | None = field(default=None, metadata=spec(lo=-VAR_MAX, hi=VAR_MAX))
    batch: float | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    nonfinite: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))
    sparse: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))
    step: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    loss: float | None = field(default=None, metadata=spec(lo=-METRIC_LIMIT, hi=METRIC_LIMIT))
    optimizer: str | None = field(default=None, metadata=spec(max_len=64))  # its class: Adam-family or not
    every: int = field(default=1, metadata=spec(lo=1, hi=EVERY_MAX))  # the norms on every k-th step
