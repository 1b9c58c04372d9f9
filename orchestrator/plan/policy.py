"""How stragglers and slowing workers are judged: one policy, built from the spec, kept in plan.json.

The live monitor judges a run with it, and ``report`` and ``scale`` read it back from the run's
plan.json, so a run is judged by the same thresholds while it runs and afterwards (they used to
differ: the monitor left out ``min_share``). An older plan.json without it gets the defaults of this
class, with its profile window from the nodes' ``TFCLUSTER_PROFILE_INTERVAL_S``. The spec's own
settings (``heartbeat.straggler_ratio``, ``profile_interval_s``, ``kill_stragglers``) default to
the spec model's defaults, so each default is written once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..spec.model import HeartbeatSpec

_SPEC = HeartbeatSpec.model_fields


@dataclass(frozen=True)
class StragglerPolicy:
    """The thresholds of the straggler and slowing-worker rules, and the step clock's window."""

    ratio: float = _SPEC["straggler_ratio"].default  # its own work per step ≥ this times the others' median
    min_ms: float = 5.0  # an excess below this is noise, whatever the ratio
    min_share: float = 0.1  # ... and so is one below this share of the step
    confirmations: int = 2  # consecutive profile rounds naming the same worker
    slowing_score: float = 0.6  # individual score (best window / now) that flags a slowing worker
    slowing_margin: float = 0.15  # ... at least this much below the other workers' (median) score
    kill: bool = _SPEC["kill_stragglers"].default  # a confirmed straggler tears the job down
    profile_interval_s: float = _SPEC["profile_interval_s"].default  # one step-clock window (0: off)

    @classmethod
    def from_spec(cls, spec: Any) -> StragglerPolicy:
        hb = spec.heartbeat
        return cls(ratio=hb.straggler_ratio, kill=hb.kill_stragglers, profile_interval_s=hb.profile_interval_s)

    @property
    def window_s(self) -> float:
        """The length of one step-clock window (the default one when the step clock was off)."""
        return self.profile_interval_s if self.profile_interval_s > 0 else StragglerPolicy.profile_interval_s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, profile_interval_s: Any = None) -> StragglerPolicy:
        """The policy a plan.json holds; a missing or damaged value gets its default (an older
        plan.json has none: ``profile_interval_s`` is then the nodes' setting, when given)."""
        data = data if isinstance(data, Mapping) else {}
        if "profile_interval_s" not in data and profile_interval_s is not None:
            data = {**data, "profile_interval_s": profile_interval_s}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            v = data.get(f.name)
            default = f.default
            if isinstance(default, bool):
                values[f.name] = v if isinstance(v, bool) else default
            elif isinstance(default, int):
                values[f.name] = v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else default
            else:
                values[f.name] = _number(v, default)
        return cls(**values)


def _number(x: Any, default: float) -> float:
    """A finite, non-negative number (also from a string, as the env holds it), else ``default``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) and v >= 0 else default
