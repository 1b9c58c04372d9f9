"""Mixed GPU models: which model sets the pace, how long the others wait, and the what-if — computed from
synthetic per-worker step-clock timings whose answers are worked out by hand here."""

from __future__ import annotations

import json

import pytest

from orchestrator.runs import RunDir
from orchestrator.views.pace import pace, pace_advice
from orchestrator.views.report import build_report, report_text

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
T0 = 1_800_000_000.0


def worker(own: float, step: float, host: str) -> dict:
    """A worker's step-clock figures: its own work per step, the rest of the step inside the collectives."""
    return {"pre_collective_ms": own, "collective_ms": step - own, "step_ms": step, "host": host}


def test_two_slow_hosts_set_the_pace_and_the_what_if_is_computed():
    """8 workers, 100 ms steps: 2 A100 hosts work 90 ms per step, 6 H100 hosts 40 ms; the all-reduce
    itself is 10 ms (the A100s' time inside it). The H100s wait 50 ms per step. Without the A100s a step
    is 40 + 10 = 50 ms: 2.0x per step; with 6 of 8 workers' examples per step, 2.0 x 6/8 = 1.5x per example."""
    workers = {f"worker:{i}": worker(90.0 if i < 2 else 40.0, 100.0, f"node{i}") for i in range(8)}
    models = {t: [{"name": A100 if i < 2 else H100}] for i, t in enumerate(workers)}
    got = pace(workers, models)
    assert got.pace_model == A100 and got.pace_workers == 2 and got.workers == 8
    assert got.models[H100].to_dict() == {
        "workers": 6,
        "tasks": [f"worker:{i}" for i in range(2, 8)],
        "hosts": [f"node{i}" for i in range(2, 8)],
        "own_work_ms": 40.0,
        "wait_ms": 50.0,
        "wait_share": 0.5,
    }
    assert got.models[A100].wait_ms == 0.0 and got.allreduce_ms == 10.0
    assert got.step_without_ms == 50.0
    assert got.speedup_per_step == pytest.approx(2.0) and got.speedup_per_example == pytest.approx(1.5)
    assert pace_advice(got) == (
        f"mixed GPU models: the 2 hosts with {A100} set the pace — the other models' workers wait up to 50 ms per "
        "step for them; without them a step would take ≈50 ms instead of 100 (2.0x faster per step) and, with the "
        "same per-worker batch, the job would run ≈1.5x faster per example: run it on the 6 other hosts"
    )


def test_when_the_slow_hosts_still_add_throughput_the_advice_says_so():
    """4 workers, 70 ms steps: 2 A100s work 60 ms, 2 H100s 40 ms, all-reduce 10 ms. Without the A100s:
    50 ms per step (1.4x) but half the examples per step: 0.7x per example — keep them."""
    workers = {f"worker:{i}": worker(60.0 if i < 2 else 40.0, 70.0, f"node{i}") for i in range(4)}
    models = {t: [{"name": A100 if i < 2 else H100}] for i, t in enumerate(workers)}
    got = pace(workers, models)
    assert got.speedup_per_step == pytest.approx(1.4) and got.speedup_per_example == pytest.approx(0.7)
    assert pace_advice(got).endswith(
        "but with the same per-worker batch it would process only 0.70x the examples "
        "per second: they still add throughput"
    )


def test_an_even_pace_or_one_model_gives_no_what_if():
    even = {f"worker:{i}": worker(40.0, 60.0, f"node{i}") for i in range(4)}
    mixed = {t: [{"name": A100 if i < 2 else H100}] for i, t in enumerate(even)}
    assert pace_advice(pace(even, mixed)) is None
    assert pace(even, {t: [{"name": H100}] for t in even}) is None
    assert pace(even, {}) is None  # no hello facts: models unknown


def test_report_shows_each_models_wait_and_the_what_if(tmp_path):
    """The same 8 workers as step-clock windows in a run directory, with their hosts' models from the
    task_ready events: report's figures, its section per model and its advice."""
    plan = {"job": "mixed", "nodes": [{"host": f"node{i}", "task": {"type": "worker", "index": i}} for i in range(8)]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    events = [
        {
            "ts": T0,
            "event": "task_ready",
            "task": f"worker:{i}",
            "host": f"node{i}",
            "hostname": f"node{i}",
            "pid": 100 + i,
            "gpus": [{"name": A100 if i < 2 else H100, "memory_mb": 81920}],
        }
        for i in range(8)
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = []
    for w in range(6):
        for i in range(8):
            own = 90.0 if i < 2 else 40.0
            lines.append(
                {
                    "task": f"worker:{i}",
                    "kind": "profile",
                    "ts": T0 + w,
                    "steps": 10,
                    "step_ms": 100.0,
                    "input_ms": 1.0,
                    "compute_ms": own - 3.0,
                    "collective_ms": 100.0 - own,
                    "update_ms": 1.0,
                    "host_ms": 1.0,
                    "other_ms": 0.0,
                    "pre_collective_ms": own,
                }
            )
    (tmp_path / "heartbeats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = build_report(RunDir(tmp_path))
    assert rep.pace.speedup_per_example == pytest.approx(1.5)
    assert any(a.startswith(f"mixed GPU models: the 2 hosts with {A100} set the pace") for a in rep.advice), rep.advice
    # the step clock's straggler (one of the two A100 hosts) is its model's pace, not its own fault
    assert any(
        a.startswith("worker:0 is a straggler") and f"cause: GPU model — {A100}, on 2 host(s)" in a for a in rep.advice
    )
    text = report_text(rep)
    assert f"  {H100}: 6 worker(s), own work 40.0 ms/step, waiting for the slowest 50.0 ms/step (50% of a step)" in text
    assert (
        f"  {A100}: 2 worker(s), own work 90.0 ms/step, waiting for the slowest 0.0 ms/step (0% of a step)  <- sets the pace"
        in text
    )
