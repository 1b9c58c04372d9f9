"""The training loss and the gradient noise scale as ``report`` holds them, typed (``loss.loss_curve`` and
``noise_scale.noise_scale`` compute them).

Why separate from the arithmetic: ``scale`` and ``predict`` keep the plain figures in scale.json (a file
format of their own); the report's views (text, HTML, the loss picture) read these. ``to_dict`` writes
the shape ``report --json`` always printed — for the noise scale, only the keys its verdict set: the
estimator's notes once norms were recorded, the figures once a window resolved, ``reason`` when it did
not, ``at_least`` when |G|² was not distinguishable from 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LossMark:
    """Where the curve starts: its first step, the examples then and time 0."""

    step: int
    examples: int | None
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LossPoint:
    """The mean loss per step over an interval ending at ``step`` (``time_s`` since the first step)."""

    step: int
    examples: int | None
    time_s: float
    loss: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LossCurve:
    """``report --json`` ``loss``: the curve, the final loss (the mean over its last steps), the last
    interval's, and where the loss came from (``callback``, ``user``, ``stamps``)."""

    source: str | None
    workers: int
    start: LossMark
    points: tuple[LossPoint, ...]
    final: float | None
    last: float | None
    steps: int

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> LossCurve:
        return cls(
            source=d["source"],
            workers=d["workers"],
            start=LossMark(**d["start"]),
            points=tuple(LossPoint(**p) for p in d["points"]),
            final=d["final"],
            last=d["last"],
            steps=d["steps"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "workers": self.workers,
            "start": self.start.to_dict(),
            "points": [p.to_dict() for p in self.points],
            "final": self.final,
            "last": self.last,
            "steps": self.steps,
        }


@dataclass(frozen=True)
class NoiseWindow:
    """One step-clock round: the smoothed B_simple then and the round's own |G|² and tr(Σ)."""

    ts: float
    step: int | None
    loss: float | None
    b_simple: float | None
    stderr: float | None
    g2: float | None
    tr_sigma: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The estimator's figures, present once a window resolved (``NoiseScale.replicas`` is not None).
_FIGURES = ("replicas", "g2", "g2_se", "tr_sigma", "tr_se", "loss")


@dataclass(frozen=True)
class NoiseScale:
    """``report --json`` ``noise_scale``: B_simple now and its standard error, or why not (``reason``)."""

    b_simple: float | None = None
    stderr: float | None = None
    global_batch: float | None = None
    steps: int = 0  # the steps whose norms the estimate used: one in ``every``
    windows: tuple[NoiseWindow, ...] = ()
    #: what the estimate is of (set once norms were recorded: ``kind`` not None)
    optimizer: str | None = None
    kind: str | None = None
    notes: tuple[str, ...] = ()
    replicas: int | None = None
    g2: float | None = None
    g2_se: float | None = None
    tr_sigma: float | None = None
    tr_se: float | None = None
    loss: float | None = None
    reason: str | None = None
    #: |G|² not distinguishable from 0: B_simple is at least ``at_least`` (None: not even that is known)
    bounded: bool = False
    at_least: float | None = None
    #: the norms on every k-th step (``TFCLUSTER_GRADNOISE_EVERY``): ``steps`` are the sampled ones
    every: int = 1

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> NoiseScale:
        """From ``noise_scale.noise_scale``'s figures."""
        return cls(
            b_simple=d["b_simple"],
            stderr=d["stderr"],
            global_batch=d["global_batch"],
            steps=d["steps"],
            windows=tuple(NoiseWindow(**w) for w in d["windows"]),
            optimizer=d.get("optimizer"),
            kind=d.get("kind"),
            notes=tuple(d.get("notes") or ()),
            **{k: d.get(k) for k in _FIGURES},
            reason=d.get("reason"),
            bounded="at_least" in d,
            at_least=d.get("at_least"),
            every=int(d.get("every") or 1),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "b_simple": self.b_simple,
            "stderr": self.stderr,
            "global_batch": self.global_batch,
            "steps": self.steps,
            "windows": [w.to_dict() for w in self.windows],
        }
        if self.kind is not None:
            out.update(optimizer=self.optimizer, kind=self.kind, notes=list(self.notes), every=self.every)
        if self.replicas is not None:
            out.update({k: getattr(self, k) for k in _FIGURES})
        if self.reason is not None:
            out["reason"] = self.reason
        if self.bounded:
            out["at_least"] = self.at_least
        return out
