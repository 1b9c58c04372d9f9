"""`tfcluster report`: why a job does (not) scale, from its heartbeats and step-clock samples.

Under synchronous all-reduce a step lasts as long as the slowest worker's work plus the all-reduce:

    step ≈ max_i(pre_i) + allreduce       pre_i = work before entering the all-reduce (input + compute)

Every worker spends `step - pre_i` inside the collective; the straggler spends the least there.
From the per-worker step-clock medians we split a step into useful work (the median worker's pre),
time lost waiting for the slowest worker (max pre - median pre), and communication (the rest), and
estimate the scaling efficiency as useful / step: the fraction of each step doing work that a
single worker would also do.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from worker_entry.protocol.env import Env

from ..core.text import table
from ..runs import RunDir, read_jsonl
from ..supervise import find_straggler

PROFILE_KEYS = ("step_ms", "collective_ms", "input_ms", "compute_ms", "pre_collective_ms", "cpu_ms")


def _median(xs: list[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def build_report(run: RunDir, last_s: float | None = None) -> dict[str, Any]:
    """The report of a run; ``last_s`` keeps only samples from the run's last ``last_s`` seconds
    (a straggler that appeared mid-run is diluted in whole-run medians)."""
    profiles: dict[str, list[dict[str, Any]]] = {}
    beats: dict[str, list[dict[str, Any]]] = {}
    for rec in read_jsonl(run.heartbeats_jsonl):
        task = rec.get("task")
        if task:
            (profiles if rec.get("kind") == "profile" else beats).setdefault(task, []).append(rec)
    window = None
    # the end of training: the last step-clock sample (heartbeats go on through teardown)
    end = max((r.get("ts") or 0 for rs in profiles.values() for r in rs), default=0) or max(
        (r.get("ts") or 0 for rs in beats.values() for r in rs), default=0
    )
    if last_s is not None:
        start = end - last_s
        profiles = {t: [r for r in rs if start <= (r.get("ts") or 0)] for t, rs in profiles.items()}
        beats = {t: [r for r in rs if start <= (r.get("ts") or 0) <= end] for t, rs in beats.items()}
        window = {"last_s": last_s, "from_ts": round(start, 3), "to_ts": round(end, 3)}
    plan = run.read_json(run.plan_json) or {}
    nodes = plan.get("nodes") or [{}]
    profile_window_s = float((nodes[0].get("env") or {}).get(Env.PROFILE_INTERVAL_S) or 10)
    hosts = {f"{n['task']['type']}:{n['task']['index']}": n["host"] for n in plan.get("nodes", [])}
    stragglers = [
        {k: ev.get(k) for k in ("ts", "task", "host", "wait_ms", "share", "cause", "message")}
        for ev in read_jsonl(run.events_jsonl)
        if ev.get("event") == "straggler"
    ]

    workers: dict[str, dict[str, Any]] = {}
    for task in sorted(set(hosts) | set(beats) | set(profiles)):
        bs = beats.get(task, [])
        progress = [b["progress"] for b in bs if isinstance(b.get("progress"), dict)]
        steps = max((p.get("steps") or 0 for p in progress), default=None)
        steps_per_s = None
        if len(progress) >= 2:
            first, last = progress[0], progress[-1]
            dt = (last.get("ts") or 0) - (first.get("ts") or 0)
            if dt > 0:
                steps_per_s = ((last.get("steps") or 0) - (first.get("steps") or 0)) / dt
        w: dict[str, Any] = {
            "host": hosts.get(task),
            "steps": steps,
            "steps_per_s": round(steps_per_s, 2) if steps_per_s else None,
            "step_time_ms": _round(_median([p.get("step_time_s") for p in progress if p.get("step_time_s")]), 1000),
            "cpu_pct": _round(_median([b.get("cpu_pct") for b in bs if b.get("cpu_pct") is not None])),
            "rss_mb_max": max((b.get("rss_mb") or 0 for b in bs), default=None),
            "gpu_util_pct": _round(_median([g.get("util") for b in bs for g in (b.get("gpus") or [])])),
            "profiles": len(profiles.get(task, [])),
        }
        for key in PROFILE_KEYS:
            w[key] = _round(_median([p.get(key) for p in profiles.get(task, [])]))
        workers[task] = w

    analysis = analyse(workers)
    if stragglers and end:
        # detection needs two slow windows in a row: the event follows the second one, so the
        # windows since ~1.5 windows before the first event are the slow ones
        first = min(x["ts"] or end for x in stragglers)
        analysis["suggested_last_s"] = math.ceil(end - first + 1.5 * profile_window_s)
    return {
        "run_dir": str(run.path),
        "job": plan.get("job"),
        "window": window,
        "workers": workers,
        "stragglers": stragglers,
        **analysis,
    }


def _round(x: float | None, scale: float = 1.0) -> float | None:
    return None if x is None else round(x * scale, 2)


def analyse(workers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Step split and efficiency from per-worker step-clock medians; advice in plain words."""
    prof = {t: w for t, w in workers.items() if w.get("pre_collective_ms") is not None and w.get("step_ms")}
    if not prof:
        if any(w.get("steps") for w in workers.values()):
            why = (
                "no step-clock samples, although training steps were reported: the training was shorter than "
                "one step-clock window (heartbeat.profile_interval_s), or the step clock is off "
                "(TFCLUSTER_STEPCLOCK=0, or a custom loop: see docs/instrumentation.md)"
            )
        else:
            why = (
                "no step-clock samples: run with job.instrument: true and heartbeat.profile_interval_s > 0 "
                "(Keras fit under MWMS is instrumented automatically)"
            )
        return {"efficiency": None, "split": None, "advice": [why]}
    step = statistics.median(w["step_ms"] for w in prof.values())
    pres = {t: w["pre_collective_ms"] for t, w in prof.items()}
    median_pre = statistics.median(pres.values())
    slowest = max(pres, key=lambda t: pres[t])
    straggler_loss = max(0.0, pres[slowest] - median_pre)
    comm = max(0.0, step - pres[slowest])
    useful = min(median_pre, step)
    split = {
        "step_ms": round(step, 2),
        "work_ms": round(useful, 2),
        "waiting_for_slowest_ms": round(straggler_loss, 2),
        "communication_ms": round(comm, 2),
        "slowest_worker": slowest,
        "input_ms": _round(_median([w.get("input_ms") for w in prof.values()])),
    }
    efficiency = useful / step if step > 0 else None
    advice = []
    finding = find_straggler({t: dict(w) for t, w in prof.items()}, ratio=1.5, min_ms=5.0, min_share=0.1)
    if finding is not None:
        advice.append(
            f"{finding.task} is a straggler: the others wait ≈{finding.wait_ms:.0f} ms per step for it "
            f"({finding.share:.0%} of a step); cause: {finding.cause} — {finding.detail}"
        )
    if step > 0 and comm / step > 0.5:
        advice.append(
            f"communication-bound: {comm / step:.0%} of each step is the gradient all-reduce. Larger per-worker "
            "batches (fewer all-reduces per example), NCCL on GPUs, a faster network, or fp16 gradients help"
        )
    if split["input_ms"] and step > 0 and split["input_ms"] / step > 0.2:
        advice.append("input-bound: tf.data takes >20% of a step; add .prefetch(AUTOTUNE), parallel map, cache")
    if not advice:
        advice.append("no dominant bottleneck found: work dominates the step, which is what scales")
    return {"efficiency": round(efficiency, 3) if efficiency is not None else None, "split": split, "advice": advice}


def report_text(rep: dict[str, Any]) -> str:
    lines = [f"job {rep.get('job')}   run {rep.get('run_dir')}", ""]
    rows = [
        (
            "TASK",
            "HOST",
            "STEPS",
            "STEP ms",
            "STEPS/s",
            "PRE-AR ms",
            "IN AR ms",
            "INPUT ms",
            "CPU ms/step",
            "CPU%",
            "RSS MB",
        )
    ]
    for t, w in rep["workers"].items():
        rows.append(
            (
                t,
                str(w.get("host") or ""),
                _s(w.get("steps")),
                _s(w.get("step_time_ms")),
                _s(w.get("steps_per_s")),
                _s(w.get("pre_collective_ms")),
                _s(w.get("collective_ms")),
                _s(w.get("input_ms")),
                _s(w.get("cpu_ms")),
                _s(w.get("cpu_pct")),
                _s(w.get("rss_mb_max")),
            )
        )
    lines += table(rows)
    split = rep.get("split")
    if split:
        s = split["step_ms"]
        parts = [
            ("work before the all-reduce (median worker)", split["work_ms"]),
            (f"waiting for the slowest ({split['slowest_worker']})", split["waiting_for_slowest_ms"]),
            ("all-reduce communication", split["communication_ms"]),
        ]
        over = "the workers' step-clock samples"
        if rep.get("window"):
            over += f" of the last {rep['window']['last_s']:g} s"
        lines += ["", f"a step takes {s:.1f} ms (median over {over}):"]
        lines += [f"  {label:<46}{ms:8.1f} ms  {ms / s:6.1%}" for label, ms in parts]
        lines += [
            f"scaling efficiency ≈ {rep['efficiency']:.0%} (useful work / step time: N workers give efficiency x N times one worker)",
        ]
    if rep.get("stragglers"):
        lines += ["", "straggler events:"] + [f"  {s['task']} ({s['host']}): {s['message']}" for s in rep["stragglers"]]
        if not rep.get("window") and rep.get("suggested_last_s"):
            lines.append(
                f"  (the split above is over the whole run; `--last {rep['suggested_last_s']}s` splits only the "
                "steps since the first straggler appeared)"
            )
    lines += ["", "advice:"] + [f"  - {a}" for a in rep["advice"]]
    return "\n".join(lines)


def _s(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
