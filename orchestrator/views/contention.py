"""When what a prediction starts from contradicts the model: CPU contention. Pure, on plain values.

The scaling model (``predict_model``) keeps each worker's own work per step constant in N: every new
worker brings its own cores. Measured (issue 32): three workers of the Keras tutorial on a 2-core box —
own work per step went from 10.3 ms at one worker to ~31 ms at three, the all-reduce (whose gRPC threads
need a CPU too) grew with it, every worker waited for a CPU most of the time it was runnable, and
`predict` said 12.8 / 13.7 ms at 2 / 3 workers where the sweep measured 48.3 / 84.6 ms, advising "scales
well" with confidence.

So the sizes a sweep measured are read as evidence: when own work grew with N, or every host's workers
waited for a CPU (``supervise.shared``'s "cpu wait"), the model's assumption is contradicted. The
prediction then says so (confidence "low", with the measurements that contradict it) and corrects each
size with what the sizes *below* it measured — the own work per step, and (under CPU wait) the
all-reduce's excess over the network model — each continued linearly past the largest of them (CPU
contention is linear in the workers sharing the cores once they are saturated). A measured size is
predicted from the sizes below it only, so its error beside the measurement is an honest one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cpushare import CpuShare, per_machine_at
from .split import JobSplit

#: Own work per step grown by more than this factor over the smallest size: not "constant in N".
GROWTH = 1.25
#: Kinds of ``shared_problems`` (every host alike) that mean the workers lack CPU.
CPU_KINDS = ("cpu wait", "cpu throttled", "steal")


@dataclass(frozen=True)
class Point:
    """One measured size, as the correction needs it (milliseconds per step)."""

    workers: int
    own_ms: float
    allreduce_ms: float
    waiting_ms: float
    model_allreduce_ms: float  # the network model's all-reduce at this size
    cpu_problem: str | None = None  # every host lacking CPU (the shared problem's detail), else None


@dataclass(frozen=True)
class Contention:
    """The verdict on a prediction's inputs: ``reasons`` (empty: nothing contradicts the model)."""

    reasons: list[str] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    # each contradiction as data (predict --json's ``contradictions``): ``kind`` names it
    found: list[dict[str, Any]] = field(default_factory=list)
    share: CpuShare | None = None  # the smallest run's CPU figures (cpushare), where recorded
    layouts: dict[int, tuple[int, int]] = field(default_factory=dict)  # workers → (machines, most on one)

    @property
    def contradicted(self) -> bool:
        return bool(self.reasons)


def point_of(size: Mapping[str, Any], model_allreduce_ms: float) -> Point | None:
    """A measured size (scale.json's ``sizes`` entry, or one run's) as a Point; None without a split."""
    sp = JobSplit.from_dict(size.get("split"))
    if sp is None:
        return None
    ar, wait = sp.allreduce_ms, sp.waiting_for_slowest_ms
    cpu = next(
        (str(p.get("detail")) for p in size.get("shared_problems") or [] if p.get("kind") in CPU_KINDS),
        None,
    )
    return Point(int(size["workers"]), sp.step_ms - ar - wait, ar, wait, model_allreduce_ms, cpu)


def assess(
    points: Sequence[Point], share: CpuShare | None = None, layouts: Mapping[int, tuple[int, int]] | None = None
) -> Contention:
    """What in the measured sizes contradicts "own work per step constant in N" (smallest size first)."""
    pts = sorted(points, key=lambda p: p.workers)
    if not pts:
        return Contention(share=share, layouts=dict(layouts or {}))
    base, reasons, found = pts[0], [], []
    grown = [p for p in pts[1:] if base.own_ms > 0 and p.own_ms > GROWTH * base.own_ms]
    if grown:
        top = grown[-1]
        reasons.append(
            f"each worker's own work per step grew from {base.own_ms:.1f} ms at {base.workers} to "
            f"{top.own_ms:.1f} ms at {top.workers} workers (x{top.own_ms / base.own_ms:.1f}); the model "
            "keeps it constant"
        )
        found.append(
            {
                "kind": "own work grew with the workers",
                "from_workers": base.workers,
                "from_ms": round(base.own_ms, 3),
                "to_workers": top.workers,
                "to_ms": round(top.own_ms, 3),
            }
        )
    starved = [p for p in pts if p.cpu_problem]
    if starved:
        p = starved[-1]
        reasons.append(f"at {p.workers} worker(s) {p.cpu_problem}")
        found.append({"kind": "workers waited for a CPU", "workers": p.workers, "detail": p.cpu_problem})
    return Contention(reasons, pts, found, share, dict(layouts or {}))


def share_row(row: Mapping[str, Any], verdict: Contention, base_own_ms: float) -> dict[str, Any]:
    """The model's row with its own work grown by the CPU share of the workers on one machine (cpushare),
    efficiency still against one worker's own work; the row as it is without a recorded share."""
    out = dict(row)
    if verdict.share is None:
        return out
    n = int(row["workers"])
    k = per_machine_at(n, verdict.layouts)
    f = verdict.share.inflation(k)
    out.update(workers_per_machine=k, own_inflation=round(f, 3))
    if f <= 1.0:
        return out
    own = float(row["own_ms"]) * f
    step = own + float(row["waiting_for_slowest_ms"]) + float(row["allreduce_ms"])
    eff = base_own_ms / step if step > 0 else None
    out.update(
        step_ms=round(step, 3),
        own_ms=round(own, 3),
        allreduce_share=round(float(row["allreduce_ms"]) / step, 3) if step > 0 else None,
        steps_per_s=round(1e3 / step, 3) if step > 0 else None,
        speedup=None if eff is None else round(n * eff, 3),
        efficiency=None if eff is None else round(eff, 3),
    )
    if row.get("examples_per_s") and row.get("step_ms"):
        out["examples_per_s"] = round(float(row["examples_per_s"]) * float(row["step_ms"]) / step, 1)
    return out


def basis(row: dict[str, Any], verdict: Contention) -> None:
    """Per size, what its prediction rests on (``basis``), and where the measurements contradict the model
    and neither the sizes measured below it nor the CPU share correct it, ``cannot_predict``: why it is a guess."""
    if row.get("corrected_from"):
        row["basis"] = "corrected from the sizes measured below it: " + ", ".join(map(str, row["corrected_from"]))
    elif (row.get("own_inflation") or 1.0) > 1.0:
        row["basis"] = (
            f"the model, own work x{row['own_inflation']:.2f} for {row['workers_per_machine']} worker(s) per machine "
            "(processor sharing of its cores)"
        )
    else:
        row["basis"] = "the model"
    below = [p.workers for p in verdict.points if p.workers < int(row["workers"])]
    modelled = (row.get("own_inflation") or 1.0) > 1.0  # the CPU share of a machine's workers is modelled
    if verdict.contradicted and not row.get("corrected_from") and not modelled and int(row["workers"]) > 1:
        row["cannot_predict"] = (
            f"the measurements contradict the model ({verdict.found[0]['kind'] if verdict.found else 'contention'}) "
            f"and {'only ' + ', '.join(map(str, below)) + ' worker(s) were' if below else 'no size was'} measured "
            "below it: how its own work grows is not measured"
        )


def _continued(xs: Sequence[tuple[int, float]], n: int) -> float:
    """y at n from the points (x, y) below it: the last one's, continued with the slope of the last two
    (never downwards: contention does not ease with more workers)."""
    (x1, y1) = xs[-1]
    if len(xs) < 2 or n <= x1:
        return y1
    (x0, y0) = xs[-2]
    return y1 + (n - x1) * max(0.0, (y1 - y0) / (x1 - x0))


def correct(
    row: Mapping[str, Any], verdict: Contention, wait_factor: Callable[[int, int], float]
) -> dict[str, Any] | None:
    """The model's row at its size corrected with the sizes measured below it, or None when nothing
    below it says more than the model (then the row stands, flagged by the verdict). ``wait_factor(n,
    m)``: how the wait for the slowest worker grows from m to n workers (the model's allowance)."""
    if not verdict.contradicted:
        return None
    n = int(row["workers"])
    below = [p for p in verdict.points if p.workers < n]
    if len(below) < 2 and not (below and below[-1].cpu_problem and below[-1].workers > 1):
        return None  # one size below: no growth measured (a size > 1 under CPU wait at least has its all-reduce)
    own = _continued([(p.workers, p.own_ms) for p in below], n)
    if any(p.cpu_problem for p in below):  # the all-reduce includes every host's wait for a CPU
        excess = [(p.workers, p.allreduce_ms - p.model_allreduce_ms) for p in below]
        ar = float(row["allreduce_ms"]) + max(0.0, _continued(excess, n))
    else:
        ar = float(row["allreduce_ms"])
    multi = [p for p in below if p.workers > 1]
    wait = multi[-1].waiting_ms * wait_factor(n, multi[-1].workers) if multi else float(row["waiting_for_slowest_ms"])
    step = own + wait + ar
    speedup = n * verdict.points[0].own_ms / step if step > 0 else None  # as the model: against one worker's own work
    out = dict(row)
    out.update(
        step_ms=round(step, 3),
        own_ms=round(own, 3),
        waiting_for_slowest_ms=round(wait, 3),
        allreduce_ms=round(ar, 3),
        allreduce_share=round(ar / step, 3) if step > 0 else None,
        steps_per_s=round(1e3 / step, 3) if step > 0 else None,
        speedup=None if speedup is None else round(speedup, 3),
        efficiency=None if speedup is None else round(speedup / n, 3),
        corrected_from=[p.workers for p in below],
    )
    if row.get("examples_per_s") and row.get("step_ms"):
        out["examples_per_s"] = round(float(row["examples_per_s"]) * float(row["step_ms"]) / step, 1)
    return out


def confidence(verdict: Contention, largest_measured: int) -> dict[str, Any]:
    """predict --json's ``confidence``: "high" when nothing contradicts the model, else "low" and why."""
    if not verdict.contradicted:
        return {"level": "high", "reasons": [], "contradictions": []}
    return {
        "level": "low",
        "contradictions": verdict.found,
        "reasons": [
            *verdict.reasons,
            "sizes are corrected with what the sizes measured below them show (own work per step; under CPU wait "
            f"the all-reduce's excess over the network model), continued linearly past {largest_measured} workers",
        ],
    }


def assumption_lines(verdict: Contention) -> list[str]:
    """What changes in the model's assumptions where the measurements contradict them, and the CPU share."""
    out = []
    if verdict.share is not None:
        s = verdict.share
        out.append(
            f"workers on one machine (the same kernel boot id) share its {s.pool(s.per_machine):g} usable cores (processor "
            f"sharing): each kept {s.demand_cores:.2f} cores busy per step and waited for a CPU {100 * s.wait:.0f}% "
            "of its runnable time at the smallest size; a size not measured is placed as densely as the largest "
            "measured one"
        )
    if verdict.contradicted:
        out.append(
            "contradicted by the measurements (confidence low): where two or more sizes were measured below a size "
            "(marked *), its own work per step is not kept but continued from them, and under CPU wait so is the "
            "all-reduce's excess over the network model"
        )
    return out


def text_lines(conf: Mapping[str, Any]) -> list[str]:
    """predict's text: the confidence, and why it is low."""
    if conf.get("level") != "low":
        return []
    return ["confidence: LOW — the measurements contradict the model:", *[f"  - {r}" for r in conf["reasons"]], ""]


def advice_line(verdict: Contention) -> str:
    """The advice that replaces "scales well" when the inputs contradict the model."""
    return (
        "cannot predict with confidence: "
        + "; ".join(verdict.reasons)
        + ". The workers share CPUs (contention), which the model does not assume: give each worker its own "
        "cores (fewer workers per host, or more cores each) and measure again before renting more nodes"
    )
