"""What a scaling sweep measured: per size throughput, speed-up, efficiency, split, straggler; advice
tied to the measurement that triggers it. Pure, from each size's run directory.

Throughput is measured, not estimated: the workers' own step and example counters (the step clock
counts every MWMS step and the examples of each step's batch) over each size's common training
window (``supervise.figures``, as ``report`` computes it), its first step-clock window or 20% (tracing,
warm-up) left out. Under MWMS every worker counts the global batch, so the job's rate is one worker's
rate (the median), never the sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.text import table
from ..plan.policy import StragglerPolicy
from ..runs import RunDir, plan_or_none
from ..supervise.figures import Figures, job_rate
from .batches import batch_notes, global_batch, scaling_of
from .records import heartbeat_records
from .report import build_report
from .reportmodel import flat_workers
from .stateff import compare_loss, loss_table, measure_loss

#: Below this efficiency a size is "not scaling" and its bottleneck gets advice.
GOOD_EFFICIENCY = 0.85


def measure_size(run_dir: str | Path, workers: int, target: float | None = None) -> dict[str, Any]:
    """One size: rates, batch, split, straggler and the report's advice, from its run directory; its
    training loss (the loss it ended at, when it reached ``target``) and noise scale (``stateff``)."""
    run = RunDir(Path(run_dir))
    records = heartbeat_records(run.heartbeats_jsonl)  # checked: numbers are numbers
    rep = build_report(run, records=records)
    plan = plan_or_none(run)
    window = (plan.policy if plan else StragglerPolicy()).window_s
    figures = Figures()
    gpu_mem_pct = None
    for rec in records:
        gpu_mem_pct = _max_opt(gpu_mem_pct, _gpu_mem_pct(rec.get("gpus")))
        if isinstance(rec.get("task"), str):
            figures.add(rec["task"], rec)
    # the report's rates, less each attempt's first window or 20% (tracing, first steps): steady state
    steps_per_s, examples_per_s = job_rate(figures.final(warmup_s=window))
    batch, batch_source = global_batch(records, examples_per_s, steps_per_s)  # the median step's, when known
    split = rep.split.to_dict() if rep.split else None  # scale.json keeps the report's JSON shape
    straggler = None
    if rep.stragglers:
        last = rep.stragglers[-1]
        straggler = {"task": last.task, "host": last.host, "cause": last.cause, "message": last.message}
    else:
        slowest = rep.split.slowest_worker if rep.split else None
        text = next((a for a in rep.advice if slowest and a.startswith(f"{slowest} is a straggler")), None)
        if text:
            row = rep.workers.get(slowest)
            straggler = {"task": slowest, "host": row.host if row else None, "cause": None, "message": text}
    return {
        "workers": workers,
        "run_dir": str(run_dir),
        "steps_per_s": _round(steps_per_s, 3),
        "examples_per_s": _round(examples_per_s, 1),
        "global_batch": round(batch) if batch else None,
        "per_worker_batch": round(batch / workers) if batch else None,
        "batch_from": batch_source,
        "step_ms": split.get("step_ms") if split else None,
        "split": split,
        "straggler": straggler,
        "efficiency_estimate": rep.efficiency,
        "advice": list(rep.advice),
        "gpu_mem_pct": gpu_mem_pct,
        "shared_problems": [dict(p) for p in rep.shared_problems],  # every host alike (a CPU shortage): absolute
        "per_worker": {t: {k: w.get(k) for k in SPLIT_KEYS} for t, w in flat_workers(rep.workers).items()},
        **measure_loss(records, str(run_dir), target),
    }


SPLIT_KEYS = ("step_ms", "input_ms", "compute_ms", "collective_ms", "update_ms", "host_ms", "other_ms")


def compare(sizes: list[dict[str, Any]], strong: bool) -> dict[str, Any]:
    """Speed-up and efficiency of every size against the smallest one that measured, and the notes
    on what the sizes really ran (the batch each used)."""
    unit = "examples/s" if all(s.get("examples_per_s") for s in sizes if s.get("steps_per_s")) else "steps/s"
    measured = [s for s in sizes if s.get("steps_per_s")]
    notes: list[str] = []
    if not measured:
        return {"unit": unit, "baseline_workers": None, "notes": ["no size reported training steps"]}
    base = measured[0]

    def throughput(s: dict[str, Any]) -> float:
        if unit == "examples/s":
            return float(s["examples_per_s"])
        # Steps only: weak scaling does N times the work per step; strong scaling the same work.
        return float(s["steps_per_s"]) * (1 if strong else s["workers"])

    for s in sizes:
        if not s.get("steps_per_s"):
            s.update(throughput=None, speedup=None, efficiency=None)
            continue
        s["throughput"] = round(throughput(s), 2)
        s["speedup"] = round(s["throughput"] / throughput(base), 3)
        s["efficiency"] = round(s["speedup"] / (s["workers"] / base["workers"]), 3)
    if unit == "steps/s":
        notes.append(
            "examples/s unknown at some size (one worker runs without the step clock, and its batch has no static "
            "dimension): throughput is steps/s"
            + ("" if strong else " x workers, assuming the per-worker batch stays the same (weak scaling)")
        )
    batches = {s["workers"]: (s["global_batch"], s["per_worker_batch"]) for s in measured if s.get("global_batch")}
    sources = {s.get("batch_from") for s in measured if s.get("global_batch")}
    notes += batch_notes(batches, strong, sources.pop() if len(sources) == 1 else None)
    return {"unit": unit, "baseline_workers": base["workers"], "measured_scaling": scaling_of(batches), "notes": notes}


def advise(sizes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Advice, each tied to the size and the measurement that triggers it (the largest size that
    scales badly speaks for the sweep; one slow host is named wherever it appeared)."""
    out: list[dict[str, str]] = []
    for s in sizes:
        st = s.get("straggler")
        if st:
            out.append(
                {
                    "size": str(s["workers"]),
                    "trigger": f"{st.get('task')} on {st.get('host')} named a straggler"
                    + (f" (cause: {st['cause']})" if st.get("cause") else ""),
                    "advice": f"one slow host: {st.get('host')} ({st.get('task')}). {st.get('message')}. Every step waits "
                    "for it: fix or replace that host (or leave it out) before adding workers",
                }
            )
    bad = [s for s in sizes if s.get("efficiency") is not None and s["efficiency"] < GOOD_EFFICIENCY and s.get("split")]
    worst = bad[-1] if bad else None
    if worst is None:
        if sizes and all(s.get("efficiency") is not None for s in sizes):
            top = max(sizes, key=lambda s: s["workers"])
            out.append(
                {
                    "size": str(top["workers"]),
                    "trigger": f"efficiency {top['efficiency']:.0%}",
                    "advice": f"scales well up to {top['workers']} workers: work dominates every step",
                }
            )
        return out
    sp, n = worst["split"], str(worst["workers"])
    step = sp.get("step_ms") or 0.0
    share = {
        k: (sp.get(k) or 0.0) / step if step else 0.0
        for k in ("input_ms", "allreduce_ms", "waiting_for_slowest_ms", "host_ms")
    }
    eff = f"efficiency {worst['efficiency']:.0%} at {n} workers"
    if share["input_ms"] > 0.2:
        out.append(
            {
                "size": n,
                "trigger": f"{eff}; input pipeline {share['input_ms']:.0%} of a step",
                "advice": "input-bound: add .prefetch(tf.data.AUTOTUNE), map(..., num_parallel_calls=AUTOTUNE), "
                ".cache() after the expensive steps, and read sharded files in parallel (interleave)",
            }
        )
    if share["allreduce_ms"] > 0.3 and worst.get("shared_problems"):  # the all-reduce waits for CPUs too
        out.append(
            {
                "size": n,
                "trigger": f"{eff}; the all-reduce itself {share['allreduce_ms']:.0%} of a step, "
                f"and on every host: {worst['shared_problems'][0]['kind']}",
                "advice": f"{worst['shared_problems'][0]['detail']}; the all-reduce the step clock measures includes "
                "that wait, so it is not the network's time: give the workers the CPU they need, then measure again",
            }
        )
    elif share["allreduce_ms"] > 0.3 and not worst.get("straggler"):
        out.append(
            {
                "size": n,
                "trigger": f"{eff}; the all-reduce itself {share['allreduce_ms']:.0%} of a step",
                "advice": "communication-bound: a larger per-replica batch or gradient accumulation (fewer all-reduces "
                "per example); tf.distribute.experimental.CommunicationOptions(bytes_per_pack=32 * 2**20) to pack "
                "small gradients into fewer all-reduces; on GPUs NCCL with NCCL_SOCKET_IFNAME on the fast network "
                "(and InfiniBand not disabled); mixed precision halves the compute, not the float32 gradients MWMS "
                "all-reduces, so it makes a communication-bound job more so",
            }
        )
    if share["waiting_for_slowest_ms"] > 0.2 and not worst.get("straggler"):
        out.append(
            {
                "size": n,
                "trigger": f"{eff}; waiting for the slowest worker {share['waiting_for_slowest_ms']:.0%} of a step",
                "advice": f"uneven workers: {sp.get('slowest_worker')} is the slowest; compare its host with "
                "`tfcluster report` (CPU wait, throttling, GPU clocks) and balance the input shards",
            }
        )
    if share["host_ms"] > 0.3:
        out.append(
            {
                "size": n,
                "trigger": f"{eff}; framework and loop {share['host_ms']:.0%} of a step",
                "advice": "framework-bound: Keras steps_per_execution > 1; custom loops: several steps per tf.function call",
            }
        )
    if (worst.get("gpu_mem_pct") or 0) > 95:
        out.append(
            {
                "size": n,
                "trigger": f"GPU memory {worst['gpu_mem_pct']:.0f}% used",
                "advice": "memory-bound: a smaller per-replica batch, or mixed precision (half the activations)",
            }
        )
    if not any(a["size"] == n for a in out):  # nothing specific: what the size's own report says
        out.append(
            {"size": n, "trigger": eff, "advice": "; ".join(worst.get("advice") or ["no single bottleneck found"])}
        )
    return out


def sweep_summary(runs: Sequence[Mapping[str, Any]], strong: bool, target: float | None = None) -> dict[str, Any]:
    """scale.json: every size as ran and measured, the comparison and the advice; ``target``: the
    training loss whose steps and time each size is measured to (``--to-loss``)."""
    sizes = []
    for r in runs:
        m = (
            measure_size(r["run_dir"], r["workers"], target)
            if RunDir(Path(r["run_dir"])).plan_json.exists()
            else {"workers": r["workers"]}
        )
        sizes.append({**m, "state": r["state"], "wall_s": r.get("wall_s"), "root_cause": r.get("root_cause")})
    cmp = compare(sizes, strong)
    cmp["notes"] = [*cmp["notes"], *compare_loss(sizes, target)]
    return {
        "mode": "strong" if strong else "weak",
        **cmp,
        "target_loss": target,
        "sizes": sizes,
        "advice": advise(sizes),
    }


def sweep_text(summary: Mapping[str, Any]) -> str:
    unit = summary.get("unit", "examples/s")
    rows = [
        (
            "WORKERS",
            "STATE",
            unit.upper(),
            "SPEED-UP",
            "EFFICIENCY",
            "STEP ms",
            "INPUT",
            "COMPUTE",
            "WAIT",
            "ALL-REDUCE",
            "AFTER",
            "STRAGGLER",
        )
    ]
    for s in summary["sizes"]:
        sp = s.get("split") or {}
        st = s.get("straggler")
        rows.append(
            (
                str(s["workers"]),
                str(s.get("state")),
                _f(s.get("throughput"), ".1f"),
                _f(s.get("speedup"), ".2f", "x"),
                _f(None if s.get("efficiency") is None else 100 * s["efficiency"], ".0f", "%"),
                _f(sp.get("step_ms"), ".1f"),
                _f(sp.get("input_ms"), ".1f"),
                _f(sp.get("compute_ms"), ".1f"),
                _f(sp.get("waiting_for_slowest_ms"), ".1f"),
                _f(sp.get("allreduce_ms"), ".1f"),
                _f(sp.get("after_allreduce_ms"), ".1f"),
                f"{st['task']} ({st.get('host')}): {st.get('cause') or 'slow'}" if st else "-",
            )
        )
    lines = [
        f"scaling sweep ({summary.get('mode')} scaling; speed-up against {summary.get('baseline_workers')} worker(s))",
        "",
    ]
    lines += table(rows)
    stat = loss_table(summary)
    lines += ["", *stat] if stat else []
    failed = [s for s in summary["sizes"] if s.get("root_cause")]
    for s in failed:
        lines.append(f"  {s['workers']} workers: {s['state']}: {s['root_cause'].get('message')}")
    if summary.get("notes"):
        lines += ["", "notes:"] + [f"  - {n}" for n in summary["notes"]]
    if summary.get("advice"):
        lines += ["", "advice:"] + [
            f"  - [{a['size']} workers: {a['trigger']}] {a['advice']}" for a in summary["advice"]
        ]
    return "\n".join(lines)


def _gpu_mem_pct(gpus: list[dict[str, Any]] | None) -> float | None:
    """The fullest GPU's memory use (%) in one heartbeat's (checked) NVML samples."""
    pcts = [
        100.0 * g["mem_used_mb"] / g["mem_total_mb"]
        for g in gpus or []
        if g.get("mem_used_mb") is not None and g.get("mem_total_mb")
    ]
    return max(pcts) if pcts else None


def _max_opt(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else f"{format(v, fmt)}{suffix}"
