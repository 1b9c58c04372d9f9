"""Mixed GPU models: which model sets the job's pace, how long the others wait, and what the job would
do without it — computed from the step clock's per-worker figures. Pure.

Under synchronous all-reduce every step lasts as long as the slowest worker's own work plus the
all-reduce; the others wait inside it. Per worker (``split``): its own work per step
(``pre_collective_ms`` = step - time inside the collectives) and its wait for the slowest (its time
inside the collectives - the all-reduce itself, the least any worker spends there). Then:

- each model's workers wait the median of their waits per step;
- without the pace-setting model's k hosts, a step would last the slowest remaining worker's own work
  plus the all-reduce (kept as measured; a ring over fewer hosts moves 2(n-1)/n of the buffer, slightly
  less), so steps run ``step / step'`` times faster; with the per-worker batch unchanged (MWMS splits the
  global batch evenly) a step carries (n-k)/n of the examples, so per example the job runs
  ``step / step' x (n-k)/n`` times as fast. Below 1, those hosts still add throughput.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..supervise.figures import job_step_ms

MIN_GAIN = 1.05  # below this the pace is even enough not to advise anything


@dataclass(frozen=True)
class ModelPace:
    """One GPU model's workers: their own work and their wait for the slowest, per step (medians)."""

    workers: int
    tasks: tuple[str, ...]
    hosts: tuple[str, ...]
    own_work_ms: float
    wait_ms: float
    wait_share: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "tasks": list(self.tasks),
            "hosts": list(self.hosts),
            "own_work_ms": self.own_work_ms,
            "wait_ms": self.wait_ms,
            "wait_share": self.wait_share,
        }


@dataclass(frozen=True)
class Pace:
    """``report --json`` ``pace``: per model its pace, the model that sets the job's, and the job without it."""

    models: Mapping[str, ModelPace]
    pace_model: str
    pace_workers: int
    workers: int
    step_ms: float
    allreduce_ms: float
    step_without_ms: float
    speedup_per_step: float | None
    speedup_per_example: float | None

    @property
    def slowest(self) -> ModelPace:
        """The pace-setting model's figures."""
        return self.models[self.pace_model]

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": {m: g.to_dict() for m, g in self.models.items()},
            "pace_model": self.pace_model,
            "pace_workers": self.pace_workers,
            "workers": self.workers,
            "step_ms": self.step_ms,
            "allreduce_ms": self.allreduce_ms,
            "step_without_ms": self.step_without_ms,
            "speedup_per_step": self.speedup_per_step,
            "speedup_per_example": self.speedup_per_example,
        }


def model_of(gpus: Sequence[Mapping[str, Any]] | None) -> str | None:
    """A host's GPU model(s) from its hello's facts ("NVIDIA A100-SXM4-80GB", or "A + B" when mixed)."""
    names = sorted({str(g.get("name")) for g in gpus or () if g.get("name")})
    return " + ".join(names) if names else None


def pace(
    workers: Mapping[str, Mapping[str, Any]], gpu_models: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Pace | None:
    """Per model its workers' own work and wait per step, the model that sets the pace, and the job's
    step and speed without its hosts; None unless at least two models have step-clock figures."""
    have = {
        t: w
        for t, w in workers.items()
        if w.get("pre_collective_ms") is not None and w.get("collective_ms") is not None and w.get("step_ms")
    }
    groups: dict[str, list[str]] = {}
    for t in sorted(have):
        m = model_of(gpu_models.get(t))
        if m is not None:
            groups.setdefault(m, []).append(t)
    if len(groups) < 2:
        return None
    allreduce = min(float(w["collective_ms"]) for w in have.values())
    step = job_step_ms(have.values())
    models: dict[str, ModelPace] = {}
    for m, tasks in groups.items():
        wait = statistics.median(float(have[t]["collective_ms"]) - allreduce for t in tasks)
        models[m] = ModelPace(
            workers=len(tasks),
            tasks=tuple(tasks),
            hosts=tuple(sorted({str(have[t].get("host")) for t in tasks if have[t].get("host")})),
            own_work_ms=round(statistics.median(float(have[t]["pre_collective_ms"]) for t in tasks), 2),
            wait_ms=round(wait, 2),
            wait_share=round(wait / step, 3) if step > 0 else None,
        )
    slow = max(models, key=lambda m: models[m].own_work_ms)
    rest = [t for t in have if t not in groups[slow]]
    n, k = len(have), len(groups[slow])
    step_without = max(float(have[t]["pre_collective_ms"]) for t in rest) + allreduce
    per_step = step / step_without if step_without > 0 else None
    return Pace(
        models=models,
        pace_model=slow,
        pace_workers=k,
        workers=n,
        step_ms=round(step, 2),
        allreduce_ms=round(allreduce, 2),
        step_without_ms=round(step_without, 2),
        speedup_per_step=round(per_step, 3) if per_step else None,
        speedup_per_example=round(per_step * (n - k) / n, 3) if per_step else None,
    )


def pace_lines(p: Pace) -> list[str]:
    """The report's section: per model, own work and wait per step."""
    lines = [f"GPU models (step {p.step_ms:.1f} ms, all-reduce itself {p.allreduce_ms:.1f} ms):"]
    for m, g in p.models.items():
        mark = "  <- sets the pace" if m == p.pace_model else ""
        share = f" ({g.wait_share:.0%} of a step)" if g.wait_share is not None else ""
        lines.append(
            f"  {m}: {g.workers} worker(s), own work {g.own_work_ms:.1f} ms/step, waiting for the slowest "
            f"{g.wait_ms:.1f} ms/step{share}{mark}"
        )
    return lines


def pace_advice(p: Pace) -> str | None:
    """The what-if, in words; None when the models keep an even pace."""
    per_step, per_example = p.speedup_per_step, p.speedup_per_example
    if per_step is None or per_example is None or per_step < MIN_GAIN:
        return None
    k, slow = p.pace_workers, p.pace_model
    wait = max(g.wait_ms for m, g in p.models.items() if m != slow)
    head = (
        f"mixed GPU models: the {k} host{'s' if k > 1 else ''} with {slow} set{'' if k > 1 else 's'} the pace — "
        f"the other models' workers wait up to {wait:.0f} ms per step for {'them' if k > 1 else 'it'}; without "
        f"{'them' if k > 1 else 'it'} a step would take ≈{p.step_without_ms:.0f} ms instead of {p.step_ms:.0f} "
        f"({per_step:.1f}x faster per step)"
    )
    if per_example >= MIN_GAIN:
        return (
            f"{head} and, with the same per-worker batch, the job would run ≈{per_example:.1f}x faster per example: "
            f"run it on the {p.workers - k} other hosts"
        )
    return (
        f"{head}, but with the same per-worker batch it would process only {per_example:.2f}x the examples per "
        f"second: {'they' if k > 1 else 'it'} still add{'' if k > 1 else 's'} throughput"
    )
