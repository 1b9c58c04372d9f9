"""`tfcluster predict RUN`: step time, examples/s, speed-up and efficiency at N workers, from what a
short run measured (the step clock: own work, spread, gradient bytes) and the network (`tfcluster
check`'s alpha and B, or ``--network``). The model is ``predict_model``; this module reads the run
directories, fills its inputs, compares with every size a `scale` sweep measured, and writes text/JSON.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..core.text import table
from ..events.kinds import TaskReady
from ..runs import RunDir, plan_or_none
from . import contention, cpushare
from .predict_model import (
    Inputs,
    Network,
    advice,
    expected_max_excess,
    fit_allreduce,
    parse_network,
    predict_size,
    ring_allreduce_s,
)
from .records import event_records, heartbeat_records
from .split import JobSplit
from .stateff import bound_sizes, lr_advice, noise_json, noise_of, predict_lines
from .stateff import time_to_loss_curve as ttl_curve
from .stateff import time_to_loss_summary as ttl_summary
from .sweepfiles import CHECK_JSON, SCALE_JSON, read_json_file, sweep_sizes


def network_of(check: str | None, network: str | None, near: Sequence[Path] = ()) -> Network:
    """alpha and B: ``--network`` wins, then ``--check PATH``, then a check.json beside the run; else a
    UsageError saying what to give."""
    if network:
        try:
            return parse_network(network)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    paths = [Path(check)] if check else [p / CHECK_JSON for p in near if (p / CHECK_JSON).is_file()]
    if not paths:
        raise UsageError(
            "predict needs the network: --check PATH (check.json of `tfcluster check`) or "
            "--network RATE,LATENCY (like 25Gbit,5us)"
        )
    path = paths[0]
    data = read_json_file(path, f"--check {path}")
    try:
        net = data["network"]
        lat, bw = float(net["latency_s"]), float(net["bandwidth_Bps"])
    except (ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:
        raise UsageError(
            f"--check {path}: expected check.json with network.latency_s and network.bandwidth_Bps "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not (math.isfinite(lat) and lat >= 0 and math.isfinite(bw) and bw > 0):
        raise UsageError(f"--check {path}: network.latency_s must be >= 0 and network.bandwidth_Bps > 0")
    links = Network(latency_s=lat, bandwidth_Bps=bw, source=f"{path} (slowest link)")
    return fit_allreduce(data.get("allreduce") or [], links) or links


def _workers_of(run: RunDir) -> int:
    plan = plan_or_none(run)
    return len(plan.tasks) if plan and plan.tasks else 1


def measured_sizes(path: Path) -> list[dict[str, Any]]:
    """The sizes measured at PATH: a `scale` sweep's (scale.json) or one finished run's."""
    from .scale import measure_size

    if os.path.lexists(path / SCALE_JSON):
        return sweep_sizes(path)
    run = RunDir(path)
    if not run.plan_json.is_file():
        raise UsageError(f"{path}: neither a run directory (plan.json) nor a scale sweep (scale.json)")
    return [measure_size(path, _workers_of(run))]


def _profiles(run_dir: str | Path) -> list[dict[str, Any]]:
    run = RunDir(Path(run_dir))
    return [r for r in heartbeat_records(run.heartbeats_jsonl) if r.get("kind") == "profile"]


def inputs_from(size: Mapping[str, Any]) -> Inputs:
    """The model's inputs from one measured size: its median worker's own work, the spread (fitted to
    its wait; at one worker from its windows), its gradient bytes, packs and implementation."""
    split = JobSplit.from_dict(size.get("split"))
    n = int(size["workers"])
    if split is None:
        raise UsageError(
            f"{size.get('run_dir')}: no step time (the step clock was off): run the job with "
            "TFCLUSTER_STEPCLOCK=force in job.env, or measure it with `tfcluster scale`"
        )
    own = split.step_ms - split.allreduce_ms - split.waiting_for_slowest_ms
    profiles = _profiles(size["run_dir"])
    wired = [r for r in profiles if r.get("grad_bytes") is not None]
    if not wired:
        raise UsageError(
            f"{size.get('run_dir')}: no gradient bytes in its step-clock records (a run from before "
            "tfcluster recorded them, or without the step clock): measure it again"
        )
    last = wired[-1]
    sources = {
        "own work": f"step clock, {split.worker} (median worker) at {n} worker(s)",
        "gradient bytes": f"the traced gradients ({last.get('grad_tensors')} tensors, {last.get('allreduce_impl')})",
    }
    if n > 1:
        sigma = split.waiting_for_slowest_ms / expected_max_excess(n)
        sources["spread"] = f"fitted to the wait measured at {n} workers ({split.waiting_for_slowest_ms:.1f} ms)"
    else:
        sigma = _spread_of_windows(profiles)
        sources["spread"] = (
            "the spread of one worker's step-clock windows (a lower bound: a run at 2+ workers measures it)"
        )
    return Inputs(
        own_ms=own,
        sigma_ms=sigma,
        grad_bytes=int(last["grad_bytes"]),
        packs=int(last.get("grad_packs") or 1),
        per_worker_batch=size.get("per_worker_batch"),
        implementation=str(last.get("allreduce_impl") or "auto"),
        measured_workers=n,
        sources=sources,
    )


def _spread_of_windows(profiles: Sequence[Mapping[str, Any]]) -> float:
    """The spread of one worker's own work between its windows (the first one left out: warm-up).
    Not scaled up to a per-step spread (x sqrt(steps)): a drifting load on the host would be taken for
    jitter between workers (measured: 12 ms predicted wait against 0.6 ms measured at 2 workers)."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in profiles:
        by_task.setdefault(str(r.get("task")), []).append(r)
    rs = next(iter(by_task.values()), [])[1:]
    own = [float(r["pre_collective_ms"]) for r in rs if r.get("pre_collective_ms") is not None]
    return statistics.stdev(own) if len(own) >= 2 else 0.0


def build_prediction(path: Path, sizes: Sequence[int], net: Network) -> dict[str, Any]:
    """predict's JSON: inputs, network, assumptions, per size the prediction (and, where a size was
    measured, the measurement beside it with the error), advice."""
    measured = measured_sizes(path)
    if not measured:
        raise UsageError(f"{path}: no size with a step-clock split to start from")
    base = measured[0]  # the smallest size measured
    inp = inputs_from(base)
    wanted = sorted(set(sizes) | {int(m["workers"]) for m in measured})
    verdict = contention_of(measured, inp, net)
    rows = [_corrected(inp, net, verdict, n) for n in wanted]
    by_n = {int(m["workers"]): m for m in measured}
    for row in rows:
        m = by_n.get(int(row["workers"]))
        if m:
            row.update(compare_to(row, m))
    (ns, at), per_worker = noise_of(measured), inp.per_worker_batch
    bound_sizes(rows, ns, at, per_worker)
    curve = []
    if ns.b_simple is not None and per_worker:
        curve = ttl_curve(ns, lambda n: _corrected(inp, net, verdict, n), at, per_worker)
    out_sizes = [r for r in rows if r["workers"] in sizes or "measured_step_ms" in r]
    inputs = {
        "own_ms": round(inp.own_ms, 3),
        "sigma_ms": round(inp.sigma_ms, 3),
        "grad_bytes": inp.grad_bytes,
        "packs": inp.packs,
        "per_worker_batch": inp.per_worker_batch,
        "implementation": inp.implementation,
        "measured_workers": inp.measured_workers,
        "sources": inp.sources,
    }
    return {
        "run": str(path),
        "inputs": inputs,
        "network": {"latency_s": net.latency_s, "bandwidth_Bps": net.bandwidth_Bps, "source": net.source},
        "assumptions": assumptions(inp, net) + contention.assumption_lines(verdict),
        "sizes": out_sizes,
        "noise_scale": noise_json(ns),
        "noise_at": at,
        "time_to_loss": ttl_summary(ns, per_worker, curve),
        "statistical": predict_lines(ns, at, per_worker, curve),
        "confidence": _confidence(verdict, max(by_n), out_sizes),
        "cpu_share": verdict.share.as_json() if verdict.share else None,
        "advice": _advice(inp, net, verdict, [r for r in rows if r["workers"] in sizes])
        + lr_advice(ns, at, sizes, per_worker),
    }


def _confidence(verdict: contention.Contention, largest: int, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The verdict's confidence, low also where the CPU share grows a size's own work (said per size)."""
    conf = contention.confidence(verdict, largest)
    share = verdict.share
    lines = [
        line
        for r in rows
        if share and "corrected_from" not in r
        for line in [cpushare.contention_line(share, int(r["workers"]), int(r.get("workers_per_machine") or 1))]
        if line
    ]
    if lines:
        conf["level"] = "low"
        conf["reasons"] = [*conf["reasons"], *lines]
        conf["contradictions"] = [*conf["contradictions"], {"kind": "workers share a machine's cores", "sizes": lines}]
    return conf


def contention_of(measured: Sequence[Mapping[str, Any]], inp: Inputs, net: Network) -> contention.Contention:
    """What the measured sizes say against the model's assumptions (own work constant in N)."""
    points = [
        contention.point_of(m, ring_allreduce_s(int(m["workers"]), inp.grad_bytes, net, inp.packs) * 1e3)
        for m in measured
    ]
    ready = {int(m["workers"]): _ready(m["run_dir"]) for m in measured}
    layouts = {n: cpushare.layout_of(r) for n, r in ready.items() if r}
    base = measured[0]
    records = heartbeat_records(RunDir(Path(base["run_dir"])).heartbeats_jsonl)
    share = cpushare.share_of(
        [r for r in records if r.get("kind") == "profile"],
        [r for r in records if r.get("kind") is None],
        ready.get(int(base["workers"])) or [],
    )
    return contention.assess([p for p in points if p is not None], share, layouts)


def _ready(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run's task_ready events as plain records (task, hostname, machine, cpus)."""
    return [
        {"task": e.task, "hostname": e.hostname, "machine": e.machine, "cpus": e.cpus}
        for e in event_records(RunDir(Path(run_dir)).events_jsonl)
        if isinstance(e, TaskReady)
    ]


def _corrected(inp: Inputs, net: Network, verdict: contention.Contention, n: int) -> dict[str, Any]:
    """The model's size n, corrected by what the measured sizes below it say (contention)."""
    row = contention.share_row(predict_size(inp, net, n), verdict, inp.own_ms)
    out = contention.correct(row, verdict, _wait_factor) or row
    contention.basis(out, verdict)
    return out


def _wait_factor(n: int, m: int) -> float:
    """The model's wait for the slowest worker at n workers over its wait at m."""
    return expected_max_excess(n) / expected_max_excess(m) if expected_max_excess(m) > 0 else 1.0


def _advice(inp: Inputs, net: Network, verdict: contention.Contention, rows: list[dict[str, Any]]) -> list[str]:
    """The model's advice; when the measurements contradict it, that first, and never "scales well"."""
    lines = advice(inp, net, rows)
    shared = [r for r in rows if (r.get("own_inflation") or 1.0) > cpushare.INFLATED]
    if not verdict.contradicted and not shared:
        return lines
    first = (
        contention.advice_line(verdict)
        if verdict.contradicted
        else f"own work per step grows x{float(shared[-1]['own_inflation']):.1f} at {shared[-1]['workers']} workers: "
        f"{shared[-1]['workers_per_machine']} share a machine's cores; give each worker its own cores"
    )
    return [first, *(a for a in lines if not a.startswith("scales well"))]


def compare_to(pred: Mapping[str, Any], m: Mapping[str, Any]) -> dict[str, Any]:
    """A measured size beside its prediction: the measurement and the error in % of it."""
    sp = JobSplit.from_dict(m.get("split"))
    step, allreduce = (sp.step_ms, sp.allreduce_ms) if sp else (None, None)

    def err(p: Any, x: Any) -> float | None:
        return round(100 * (float(p) - float(x)) / float(x), 1) if p is not None and x else None

    return {
        "measured_step_ms": step,
        "measured_allreduce_ms": allreduce,
        "measured_waiting_ms": sp.waiting_for_slowest_ms if sp else None,
        "measured_examples_per_s": m.get("examples_per_s"),
        "measured_efficiency": m.get("efficiency"),
        "step_error_pct": err(pred["step_ms"], step),
        "allreduce_error_pct": err(pred["allreduce_ms"], allreduce),
    }


def assumptions(inp: Inputs, net: Network) -> list[str]:
    impl = inp.implementation if inp.implementation != "auto" else "auto (ring on CPUs; NCCL on GPUs)"
    lines = [
        f"ring all-reduce ({impl}) of {inp.grad_bytes:,} gradient bytes per step in {inp.packs} pack(s), once per step "
        "after the backward pass: packs x 2(n-1) x alpha + 2(n-1)/n x S/B; no overlap with compute",
        f"alpha {net.latency_s * 1e6:.1f} us per hop, B {net.bandwidth_Bps * 8 / 1e9:.3g} Gbit/s for every link (the slowest): {net.source}",
        f"each worker's own work stays {inp.own_ms:.1f} ms per step (weak scaling: the per-worker batch "
        f"{inp.per_worker_batch or '?'} is kept); source: {inp.sources.get('own work')}",
        f"straggler allowance: the expected slowest of n workers, spread {inp.sigma_ms:.2f} ms per step "
        f"({inp.sources.get('spread')})",
        "left out: hierarchical / NCCL tree all-reduces, contention from other jobs on the links, "
        "compute-communication overlap, sparse gradients (all-gathered)",
    ]
    return lines


def prediction_text(pred: Mapping[str, Any]) -> str:
    rows = [
        (
            "WORKERS",
            "STEP ms",
            "OWN",
            "WAIT",
            "ALL-REDUCE",
            "EXAMPLES/S",
            "SPEED-UP",
            "EFFICIENCY",
            "MEASURED STEP",
            "ERR",
            "MEASURED A-R",
            "ERR",
        )
    ]
    for s in pred["sizes"]:
        rows.append(
            (
                str(s["workers"]),
                _f(s["step_ms"], ".1f") + ("*" if s.get("corrected_from") else "?" if s.get("cannot_predict") else ""),
                _f(s["own_ms"], ".1f"),
                _f(s["waiting_for_slowest_ms"], ".1f"),
                _f(s["allreduce_ms"], ".1f"),
                _f(s.get("examples_per_s"), ".0f"),
                _f(s["speedup"], ".2f", "x"),
                _f(None if s["efficiency"] is None else 100 * s["efficiency"], ".0f", "%"),
                _f(s.get("measured_step_ms"), ".1f"),
                _f(s.get("step_error_pct"), "+.0f", "%"),
                _f(s.get("measured_allreduce_ms"), ".1f"),
                _f(s.get("allreduce_error_pct"), "+.0f", "%"),
            )
        )
    lines = [f"predicted scaling of {pred['run']} (from {pred['inputs']['measured_workers']} worker(s) measured)", ""]
    lines += contention.text_lines(pred.get("confidence") or {})
    if any("steps_to_loss_at_least" in s for s in pred["sizes"]):  # statistical efficiency (stateff: bounds)
        extra = [
            (
                _f(None if s.get("statistical_efficiency") is None else 100 * s["statistical_efficiency"], ".0f", "%"),
                _f(s.get("steps_to_loss_at_least"), ".2f", "x"),
                _f(s.get("time_to_loss_at_least"), ".2f", "x"),
            )
            for s in pred["sizes"]
        ]
        at = pred.get("noise_at")  # the size the noise scale was measured at: the ratios are relative to it
        head = (f"STAT EFF vs {at}", f"STEPS TO LOSS vs {at} >=", "TIME TO LOSS >=")
        rows = [rows[0] + head] + [r + e for r, e in zip(rows[1:], extra, strict=True)]
    lines += table(rows)
    if any(s.get("corrected_from") for s in pred["sizes"]):
        lines.append("* corrected with the growth the smaller sizes measured (confidence low: see above)")
    lines += [
        f"? cannot predict {s['workers']} workers with confidence: {s['cannot_predict']}"
        for s in pred["sizes"]
        if s.get("cannot_predict")
    ]
    if pred.get("statistical"):
        lines += ["", *pred["statistical"]]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in pred["assumptions"]]
    if pred.get("advice"):
        lines += ["", "advice:"] + [f"  - {a}" for a in pred["advice"]]
    return "\n".join(lines)


def sweep_prediction(summary: Mapping[str, Any], net: Network) -> tuple[dict[str, Any], list[str]]:
    """`tfcluster scale --network/--check`: every measured size beside what the model predicts for it
    from the smallest size, with the error in % — how far to trust `predict` on this very job."""
    sizes = [s for s in summary.get("sizes") or [] if s.get("split") and s.get("run_dir")]
    try:
        if not sizes:
            raise UsageError("no size with a step-clock split")
        inp = inputs_from(sizes[0])
    except UsageError as exc:
        return {"error": str(exc)}, [f"prediction: not possible ({exc})"]
    rows = []
    verdict = contention_of(sizes, inp, net)
    for s in sizes:
        p = _corrected(inp, net, verdict, int(s["workers"]))
        rows.append({**p, **compare_to(p, s)})
    conf = _confidence(verdict, max(int(s["workers"]) for s in sizes), rows)
    out = {
        "network": {"latency_s": net.latency_s, "bandwidth_Bps": net.bandwidth_Bps, "source": net.source},
        "from_workers": inp.measured_workers,
        "sizes": rows,
        "confidence": conf,
    }
    cells = [("WORKERS", "PREDICTED STEP ms", "MEASURED", "ERR", "PREDICTED ALL-REDUCE ms", "MEASURED", "ERR")]
    for r in rows:
        cells.append(
            (
                str(r["workers"]),
                _f(r["step_ms"], ".1f"),
                _f(r["measured_step_ms"], ".1f"),
                _f(r["step_error_pct"], "+.0f", "%"),
                _f(r["allreduce_ms"], ".1f"),
                _f(r["measured_allreduce_ms"], ".1f"),
                _f(r["allreduce_error_pct"], "+.0f", "%"),
            )
        )
    lines = [
        f"prediction from {inp.measured_workers} worker(s) ({net.source}) against each size measured:",
        *table(cells),
        *contention.text_lines(conf),
    ]
    return out, lines


def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else f"{format(v, fmt)}{suffix}"
