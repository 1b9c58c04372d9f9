"""One judgement of a job's GPUs: the live monitor, `status`, `report` and the metrics all use it. Pure.

Measured on an H100 (docs/instrumentation.md): a healthy GPU doing dense math runs at 1.41-1.50 GHz of
its 1.98 GHz, at 690 W of its 700 W limit, with the clock-event reason "power cap" — every H100 under
such a load looks like this. An absolute rule (clock below its maximum, any "slowing" reason) names
every healthy GPU of a job. So, as NVIDIA's own tools judge:

- **faults**, absolute (DCGM's diagnostics fail a GPU on these): the clock-event reasons HW slowdown,
  SW and HW thermal slowdown and HW power brake, named with the reading; uncorrected ECC errors;
  critical XID events;
- **shared**: a process outside the task on one of its GPUs (NVML's process list, placed by
  worker_entry): two processes on one H100 each ran at 0.48x the throughput of one alone;
- **power limit**: an enforced limit below the board's default (or, where the default is unknown,
  below its same-model peers'): "power cap" then bites harder than on the others;
- **slow**, relative (as nvidia-resiliency-ext and DLRover compare ranks): a busy GPU whose SM clock is
  below its peers' — the other busy GPUs of the same model — by more than the chip-to-chip spread; or a
  power-capped GPU whose worker's own work per step (the step clock) is well above its same-model
  peers', or has fallen well below its own best while the others' has not.

"power cap" alone under load is the normal state of a busy GPU and is never named by itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FAULT_REASONS = ("HW slowdown", "thermal (SW)", "thermal (HW)", "power brake")  # DCGM fails on these
POWER_CAP = "power cap"  # SW power cap: clocks lowered to stay within the power limit — normal under load
BUSY_PCT = 50.0  # below this a GPU clocks down by itself: its clock says nothing about its health
PEER_CLOCK_RATIO = 0.85  # a busy GPU's SM clock below this x its same-model peers' median: slow (one
#                          H100 under load moved 1410-1500 MHz; other chips run up to ~10 % apart)
WORK_RATIO = 1 / 0.75  # own work per step vs same-model peers' (nvidia-resiliency-ext flags scores < 0.75)
SELF_SCORE = 0.75  # own best work per step / now, below this ...
SELF_MARGIN = 0.15  # ... and this much below the other workers' (the whole job slowing is not one GPU)
LIMIT_RATIO = 0.95  # enforced power limit below this x the board's default (or the peers' limit)
FAULT_SHARE = 0.1  # a fault reason counts when in this share of the samples judged (and in 2 of them)
UNPLACED_MIN = 2  # processes of another PID namespace on one GPU: one is likely the task's own

#: The cause a straggler gets from its GPU's problem, most telling first.
CAUSES = {"shared": "GPU shared", "fault": "GPU fault", "power limit": "GPU power limit", "slow": "GPU slow"}


@dataclass(frozen=True)
class GpuProblem:
    """One problem of one GPU of one task, with its reading (``detail``: one line for people)."""

    task: str
    gpu: int
    problem: str  # "fault" | "shared" | "power limit" | "slow"
    detail: str
    model: str | None = None
    reading: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int, str]:
        return self.task, self.gpu, self.problem

    def text(self) -> str:
        return f"{self.task}'s GPU {self.gpu}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "gpu": self.gpu,
            "problem": self.problem,
            "model": self.model,
            "message": self.text(),
            "reading": dict(self.reading),
        }


@dataclass(frozen=True)
class GpuJudgement:
    """Every problem found, and per model what its busy GPUs run at (the peers' reference)."""

    problems: tuple[GpuProblem, ...] = ()
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks_seen: frozenset[str] = frozenset()

    def of(self, task: str) -> list[GpuProblem]:
        return [p for p in self.problems if p.task == task]

    def by_task(self) -> dict[str, list[dict[str, Any]]]:
        """The problems as JSON, per task (status, metrics)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for p in self.problems:
            out.setdefault(p.task, []).append(p.to_dict())
        return out

    def suspect(self) -> tuple[str, str, str] | None:
        """(task, cause, detail) when exactly one worker's busy GPUs have problems and another worker's
        GPUs were judged too: a problem every worker shares names nobody as the one to wait for, and a
        problem of an idle GPU (a low limit it does not reach) slows no step."""
        busy = [p for p in self.problems if p.reading.get("busy")]
        bad = sorted({p.task for p in busy})
        if len(bad) != 1 or len(self.tasks_seen) < 2:
            return None
        mine = sorted((p for p in busy if p.task == bad[0]), key=lambda p: list(CAUSES).index(p.problem))
        return bad[0], CAUSES[mine[0].problem], "; ".join(p.text() for p in mine)


@dataclass
class _Gpu:
    """One GPU's samples, summarised."""

    task: str
    index: int
    model: str
    n: int = 0
    utils: list[float] = field(default_factory=list)
    busy_clocks: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    others: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.utils) and statistics.median(self.utils) >= BUSY_PCT

    @property
    def clock(self) -> float | None:
        return statistics.median(self.busy_clocks) if self.busy_clocks else None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _list(x: Any) -> list[Any]:
    """A list field of a sample, or nothing (a damaged run directory's record must not raise)."""
    return x if isinstance(x, list) else []


def _model_of(models: Mapping[str, Sequence[Mapping[str, Any]]], task: str, g: Mapping[str, Any]) -> str:
    """The GPU's model name (the task's hello facts), else its maximum clock as a stand-in."""
    index = g.get("index")
    for pos, info in enumerate(_list(models.get(task))):
        if isinstance(info, dict) and info.get("index", pos) == index and info.get("name"):
            return str(info["name"])
    top = _num(g.get("sm_clock_max_mhz"))
    return f"a GPU of {top:.0f} MHz maximum" if top else "a GPU of unknown model"


def _gather(samples: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]], models: Mapping[str, Any]) -> list[_Gpu]:
    gpus: dict[tuple[str, int], _Gpu] = {}
    for task, beats in samples.items():
        for beat in beats:
            for g in _list(beat):
                index = g.get("index") if isinstance(g, dict) else None
                if not isinstance(index, int):
                    continue
                acc = gpus.setdefault((task, index), _Gpu(task, index, _model_of(models, task, g)))
                acc.n += 1
                acc.last = {**acc.last, **{k: v for k, v in g.items() if v is not None}}
                util, clock = _num(g.get("util")), _num(g.get("sm_clock_mhz"))
                if util is not None:
                    acc.utils.append(util)
                    if util >= BUSY_PCT and clock:
                        acc.busy_clocks.append(clock)
                for r in _list(g.get("throttle")):
                    if isinstance(r, str):
                        acc.reasons[r] = acc.reasons.get(r, 0) + 1
                for proc in _list(g.get("others")):
                    if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
                        seen = acc.others.setdefault(proc["pid"], {**proc, "samples": 0})
                        seen["samples"] += 1
                        used = max(_num(seen.get("used_mb")) or 0, _num(proc.get("used_mb")) or 0)
                        seen["used_mb"] = int(used) if used else None
    return list(gpus.values())


def _ghz(mhz: float | None) -> str:
    return "?" if mhz is None else f"{mhz / 1000:.2f} GHz"


def _reading(g: _Gpu) -> str:
    """The numbers that go with a fault: clock against its maximum, temperature, power against its limit."""
    last = g.last
    parts = [f"{_ghz(_num(last.get('sm_clock_mhz')))} of {_ghz(_num(last.get('sm_clock_max_mhz')))}"]
    if _num(last.get("temp_c")) is not None:
        parts.append(f"{last['temp_c']:.0f} °C")
    if _num(last.get("power_w")) is not None:
        limit = _num(last.get("power_limit_w"))
        parts.append(f"{last['power_w']:.0f} W" + (f" of {limit:.0f} W" if limit else ""))
    return ", ".join(parts)


def _faults(g: _Gpu) -> GpuProblem | None:
    need = 1 if g.n == 1 else max(2, int(FAULT_SHARE * g.n + 0.999))
    hits = [r for r in FAULT_REASONS if g.reasons.get(r, 0) >= need]
    words = []
    if hits:
        share = max(g.reasons[r] for r in hits)
        words.append(
            f"{', '.join(hits)} at {_reading(g)}" + ("" if share == g.n else f" (in {share} of {g.n} samples)")
        )
    ecc = int(_num(g.last.get("ecc_uncorrected")) or 0)
    if ecc:
        words.append(f"{ecc} uncorrected ECC error{'s' if ecc > 1 else ''} (volatile count)")
    xid = int(_num(g.last.get("xid_errors")) or 0)
    if xid:
        last = g.last.get("last_xid")
        words.append(
            f"{xid} critical XID event{'s' if xid > 1 else ''}" + (f" (last: XID {last})" if last is not None else "")
        )
    if not words:
        return None
    reading = {"reasons": hits, "ecc_uncorrected": ecc or None, "xid_errors": xid or None, **_numbers(g)}
    return GpuProblem(g.task, g.index, "fault", "; ".join(words), g.model, reading)


def _numbers(g: _Gpu) -> dict[str, Any]:
    keys = ("util", "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "power_limit_w", "power_default_limit_w")
    return {**{k: g.last[k] for k in keys if k in g.last}, "busy": g.busy}


def _shared(g: _Gpu) -> GpuProblem | None:
    seen = list(g.others.values())
    foreign = [p for p in seen if p.get("visible", True)]
    unplaced = [p for p in seen if not p.get("visible", True)]
    if foreign:
        names = [
            f"PID {p['pid']} ({', '.join(x for x in (_name(p.get('name')), _mb(p.get('used_mb'))) if x) or 'unreadable'})"
            for p in foreign
        ]
        detail = f"shared with a process outside the task: {', '.join(names)}"
    elif len(unplaced) >= UNPLACED_MIN:
        pids = ", ".join(f"{p['pid']}" + (f" ({_mb(p.get('used_mb'))})" if p.get("used_mb") else "") for p in unplaced)
        detail = (
            f"likely shared: NVML lists {len(unplaced)} processes worker_entry cannot place (PIDs {pids}: another PID "
            "namespace, as inside a container, where one of them is likely the task's own)"
        )
    else:
        return None
    procs = [{k: p.get(k) for k in ("pid", "used_mb", "name", "visible")} for p in (foreign or unplaced)]
    return GpuProblem(g.task, g.index, "shared", detail, g.model, {"processes": procs, **_numbers(g)})


def _name(name: Any) -> str | None:
    return name[:64] if isinstance(name, str) and name else None


def _mb(used: Any) -> str | None:
    mb = _num(used)
    return f"{mb:.0f} MB" if mb else None


def _power_limit(g: _Gpu, peers: Sequence[_Gpu]) -> GpuProblem | None:
    limit, default = _num(g.last.get("power_limit_w")), _num(g.last.get("power_default_limit_w"))
    if not limit:
        return None
    if default:
        if limit >= LIMIT_RATIO * default:
            return None
        ref = f"below the board's default {default:.0f} W"
    else:
        theirs = [x for p in peers if (x := _num(p.last.get("power_limit_w")))]
        if not theirs or limit >= LIMIT_RATIO * statistics.median(theirs):
            return None
        ref = f"below its peers' {statistics.median(theirs):.0f} W (the other {g.model} GPUs)"
    detail = f"its power limit is {limit:.0f} W, {ref} (nvidia-smi -pl, or a site setting)"
    if POWER_CAP in g.reasons and g.busy:
        detail += f"; under load: power cap at {_reading(g)}"
    return GpuProblem(g.task, g.index, "power limit", detail, g.model, _numbers(g))


def _slow(
    g: _Gpu, peers: Sequence[_Gpu], work: Mapping[str, Mapping[str, Any]], peer_tasks: Sequence[str]
) -> GpuProblem | None:
    if not g.busy:
        return None
    clock = g.clock
    theirs = [c for p in peers if p.busy and (c := p.clock)]
    why = [r for r in g.reasons if r not in ("idle",)]
    reading = {**_numbers(g), "sm_clock_median_mhz": clock}
    if clock and theirs and clock < PEER_CLOCK_RATIO * statistics.median(theirs):
        ref = statistics.median(theirs)
        reading["peers_clock_mhz"] = ref
        detail = (
            f"runs at {_ghz(clock)}, {1 - clock / ref:.0%} below its peers' {_ghz(ref)} (the other busy {g.model} GPUs"
            + (f"; reasons: {', '.join(why)})" if why else ")")
        )
        return GpuProblem(g.task, g.index, "slow", detail, g.model, reading)
    if POWER_CAP not in g.reasons:
        return None  # its worker's slow work has another cause: the straggler's part names it
    mine = work.get(g.task) or {}
    local = _num(mine.get("local_ms"))
    others = [x for t in peer_tasks if (x := _num((work.get(t) or {}).get("local_ms")))]
    if local and others and local >= WORK_RATIO * statistics.median(others):
        ref = statistics.median(others)
        reading.update(local_ms=local, peers_local_ms=ref)
        detail = (
            f"power-capped ({_reading(g)}) while its worker's own work per step is {local / ref:.1f}x its "
            f"same-model peers' ({local:.1f} vs {ref:.1f} ms)"
        )
        return GpuProblem(g.task, g.index, "slow", detail, g.model, reading)
    score = _num(mine.get("individual"))
    typical = [x for t in work if t != g.task and (x := _num((work.get(t) or {}).get("individual")))]
    best = _num(mine.get("best_local_ms"))
    if score is not None and score < SELF_SCORE and (not typical or score <= statistics.median(typical) - SELF_MARGIN):
        reading.update(individual_score=score, local_ms=local, best_local_ms=best)
        than = f" ({local:.1f} vs {best:.1f} ms)" if local and best else ""
        detail = (
            f"power-capped ({_reading(g)}) while its worker's own work per step is {1 / score:.1f}x its own best{than}"
        )
        return GpuProblem(g.task, g.index, "slow", detail, g.model, reading)
    return None


def _task_model(gpus: Sequence[_Gpu]) -> str:
    return " + ".join(sorted({g.model for g in gpus}))


def judge_gpus(
    samples: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    models: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    work: Mapping[str, Mapping[str, Any]] | None = None,
) -> GpuJudgement:
    """The problems of every task's GPUs. ``samples``: per task, its recent heartbeats' GPU lists
    (oldest first); ``models``: per task its GPUs' ``name`` (the hello's facts, in index order);
    ``work``: per task the step clock's ``local_ms`` (own work per step), ``individual`` and
    ``best_local_ms`` (``evidence.Scores``), where there is a step clock."""
    models, work = models or {}, work or {}
    gpus = _gather(samples, models)
    by_task: dict[str, list[_Gpu]] = {}
    for g in gpus:
        by_task.setdefault(g.task, []).append(g)
    task_models = {t: _task_model(gs) for t, gs in by_task.items()}
    problems: list[GpuProblem] = []
    for g in sorted(gpus, key=lambda g: (g.task, g.index)):
        peers = [p for p in gpus if p.model == g.model and p is not g]
        peer_tasks = [t for t, m in task_models.items() if m == task_models[g.task] and t != g.task]
        found = [p for p in (_faults(g), _shared(g), _power_limit(g, peers)) if p is not None]
        if not found:
            slow = _slow(g, peers, work, peer_tasks)
            found += [slow] if slow else []
        problems += found
    summary: dict[str, dict[str, Any]] = {}
    for model in sorted({g.model for g in gpus}):
        clocks = [c for g in gpus if g.model == model and g.busy and (c := g.clock)]
        summary[model] = {
            "gpus": sum(1 for g in gpus if g.model == model),
            "busy": len(clocks),
            "clock_mhz": round(statistics.median(clocks)) if clocks else None,
        }
    return GpuJudgement(tuple(problems), summary, frozenset(by_task))
