"""Who the others wait for: the straggler of one round of per-worker step-clock samples. Pure.

Under synchronous all-reduce all wall step times are equal (the fast workers wait inside the
collective), so we compare the time each worker spends outside the collectives between two
all-reduces (``pre_collective_ms``: the time before it enters the next one), and name the part of
the step where its excess lies. ``evidence.explain`` adds what the worker's host says.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..plan.policy import StragglerPolicy
from .figures import job_step_ms

DEFAULT_POLICY = StragglerPolicy()


@dataclass(frozen=True)
class StragglerFinding:
    task: str
    wait_ms: float  # how long the others wait for it, per step
    step_ms: float
    cause: str  # "input pipeline" | "compute" | "after the all-reduce" | "host CPU" | "network" | "other" | a GPU's
    #             ("GPU shared", "GPU fault", "GPU power limit", "GPU slow": ``gpus.CAUSES``)
    pre_ms: dict[str, float]
    detail: str

    @property
    def share(self) -> float:
        return self.wait_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def host_only(self) -> bool:
        """Named by its host's (or GPU's) evidence alone: its stall is inside the all-reduce, where the
        step clock sees no excess (``evidence.explain`` builds such a finding with ``wait_ms`` 0)."""
        return self.wait_ms < 1.0


def find_straggler(
    profiles: Mapping[str, Mapping[str, Any]], policy: StragglerPolicy = DEFAULT_POLICY
) -> StragglerFinding | None:
    """The worker the others wait for, from one profile per worker, or None when nobody stands out
    (by ``policy``'s thresholds: the live monitor and ``report`` pass the run's one policy)."""
    pre = {t: float(p["pre_collective_ms"]) for t, p in profiles.items() if p.get("pre_collective_ms") is not None}
    if len(pre) < 2:
        return None
    cand = max(pre, key=lambda t: pre[t])
    others = [t for t in pre if t != cand]
    base = _median([pre[t] for t in others])
    excess = pre[cand] - base
    if excess < policy.min_ms or pre[cand] < policy.ratio * max(base, 0.1):
        return None
    step_ms = job_step_ms(profiles.values())
    if step_ms > 0 and excess < policy.min_share * step_ms:
        return None

    def excess_of(key: str) -> float | None:
        mine = profiles[cand].get(key)
        theirs = [profiles[t].get(key) for t in others if profiles[t].get(key) is not None]
        if mine is None or not theirs:
            return None
        return float(mine) - _median([float(x) for x in theirs])

    input_excess = excess_of("input_ms")
    compute_excess = excess_of("compute_ms")  # batch ready -> gradients ready (step clock)
    cpu_excess = excess_of("cpu_ms")
    update_excess, host_excess = excess_of("update_ms"), excess_of("host_ms")
    after_excess = None if update_excess is None or host_excess is None else update_excess + host_excess
    if input_excess is not None and input_excess >= 0.5 * excess:
        cause = "input pipeline"
        detail = f"its input pipeline takes {input_excess:.1f} ms/step longer than the others' to deliver a batch"
    elif compute_excess is not None and compute_excess >= 0.5 * excess:
        cause = "compute"
        detail = (
            f"its forward/backward pass takes {compute_excess:.1f} ms/step longer than the others' "
            "(slower CPU/GPU, thermal throttling, or more work on that task)"
        )
    elif after_excess is not None and after_excess >= 0.5 * excess:
        cause = "after the all-reduce"
        detail = (
            f"its work after the gradient all-reduce takes {after_excess:.1f} ms/step longer than the others' "
            f"(optimizer update {update_excess:.1f} ms, framework and host code between steps "
            f"{host_excess:.1f} ms: callbacks, logging, its training loop)"
        )
    elif cpu_excess is not None and cpu_excess >= 0.5 * excess:
        cause = "compute"
        detail = f"it spends {cpu_excess:.1f} ms/step more CPU than the others (slower CPU/GPU or more work)"
    else:
        cause = "other"
        detail = "not its input pipeline nor its own CPU time: host contention, a slower device, or its network"
    return StragglerFinding(task=cand, wait_ms=excess, step_ms=step_ms, cause=cause, pre_ms=pre, detail=detail)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
