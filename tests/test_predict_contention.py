"""`predict` heeds contention (issue 32, item 3): when the sizes a sweep measured contradict the model's
assumption (each worker's own work per step constant in N) — own work that grew, every host's workers
waiting for a CPU — the prediction says so, corrects each size with the sizes measured below it, and
never advises "scales well". Recorded inputs: the issue's sweep (three workers of the Keras tutorial on a
2-core box). Pure: no TensorFlow, no hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.views import contention
from orchestrator.views import predict as view
from orchestrator.views.predict_model import Network

LOOPBACK = Network(20e-6, 1e9, "test")  # a fast network: the model's all-reduce is well under a millisecond
CPU_WAIT = {
    "kind": "cpu wait",
    "detail": "all 3 workers' training processes waited for a CPU 64-70% of the time they were runnable",
    "wait_pct_median": 66.0,
}


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run-1"
    run.mkdir()
    rec = {"task": "worker:0", "kind": "profile", "source": "stepclock", "steps": 50, "step_ms": 10.3}
    rec.update(pre_collective_ms=10.3, grad_bytes=400_000, grad_tensors=6, grad_packs=1, allreduce_impl="auto")
    (run / "heartbeats.jsonl").write_text("\n".join(json.dumps(rec) for _ in range(3)) + "\n")
    return run


def _size(run: Path, n: int, own: float, wait: float, ar: float, problems: list | None = None) -> dict:
    split = {"worker": "worker:0", "step_ms": own + wait + ar, "allreduce_ms": ar, "waiting_for_slowest_ms": wait}
    return {
        "workers": n,
        "run_dir": str(run),
        "split": split,
        "per_worker_batch": 64,
        "shared_problems": problems or [],
    }


def _the_issues_sweep(tmp_path: Path) -> list[dict]:
    """1 worker 10.3 ms; 2 workers 48.3 ms; 3 workers 84.6 ms, own work ~31 ms, every host waiting for a CPU."""
    run = _run_dir(tmp_path)
    return [
        _size(run, 1, 10.3, 0.0, 0.0),
        _size(run, 2, 20.5, 1.0, 26.8, [CPU_WAIT]),
        _size(run, 3, 31.0, 1.5, 52.1, [CPU_WAIT]),
    ]


def test_a_cpu_starved_sweep_is_said_and_corrected_not_advised_to_scale_well(tmp_path, monkeypatch):
    measured = _the_issues_sweep(tmp_path)
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 3, 8], LOOPBACK)
    conf = pred["confidence"]
    assert conf["level"] == "low"
    assert "grew from 10.3 ms at 1 to 31.0 ms at 3 workers (x3.0)" in conf["reasons"][0]
    assert "waited for a CPU" in conf["reasons"][1]
    sizes = {s["workers"]: s for s in pred["sizes"]}
    # 2 workers: only the one-worker run is below it, so nothing measured says more than the model: flagged, uncorrected
    assert "corrected_from" not in sizes[2] and sizes[2]["step_ms"] < 15
    # 3 workers from 1 and 2: own work and the CPU-inflated all-reduce continued: within 25 % of the 84.6 ms measured
    assert sizes[3]["corrected_from"] == [1, 2]
    assert abs(sizes[3]["step_error_pct"]) <= 25, sizes[3]
    assert sizes[3]["own_ms"] == pytest.approx(30.7, abs=0.01)
    # 8 workers: from all three, beyond them; slower per step than 3, efficiency far from "scales well"
    assert sizes[8]["corrected_from"] == [1, 2, 3] and sizes[8]["step_ms"] > sizes[3]["measured_step_ms"]
    assert sizes[8]["efficiency"] < 0.2
    assert sizes[8]["step_ms"] == pytest.approx(
        sizes[8]["own_ms"] + sizes[8]["waiting_for_slowest_ms"] + sizes[8]["allreduce_ms"], abs=1e-2
    )
    assert pred["advice"][0].startswith("cannot predict with confidence: each worker's own work per step grew")
    assert not any("scales well" in a for a in pred["advice"])
    assert "contradicted by the measurements" in pred["assumptions"][-1]
    text = view.prediction_text(pred)
    assert "confidence: LOW" in text and "* corrected with the growth" in text and "scales well" not in text


def test_the_same_correction_in_scales_own_check_of_predict(tmp_path):
    measured = _the_issues_sweep(tmp_path)
    out, lines = view.sweep_prediction({"sizes": measured}, LOOPBACK)
    assert out["confidence"]["level"] == "low" and any("confidence: LOW" in line for line in lines)
    three = next(r for r in out["sizes"] if r["workers"] == 3)
    assert abs(three["step_error_pct"]) <= 25


def test_a_sweep_without_contention_keeps_the_model_and_its_confidence(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    measured = [_size(run, 1, 10.3, 0.0, 0.0), _size(run, 2, 10.8, 0.4, 3.3), _size(run, 3, 11.0, 0.6, 4.4)]
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 3, 8], LOOPBACK)
    assert pred["confidence"] == {"level": "high", "reasons": [], "contradictions": []}
    assert not any("contradicted" in a for a in pred["assumptions"])
    assert not any("corrected_from" in s for s in pred["sizes"])
    assert "confidence: LOW" not in view.prediction_text(pred)


def test_one_run_whose_worker_waited_for_a_cpu_cannot_be_predicted_with_confidence(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    starved = dict(
        CPU_WAIT, detail="the worker's training processes waited for a CPU 71% of the time they were runnable"
    )
    measured = [_size(run, 1, 10.3, 0.0, 0.0, [starved])]
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 4], LOOPBACK)
    assert pred["confidence"]["level"] == "low" and "at 1 worker(s) the worker's" in pred["confidence"]["reasons"][0]
    assert pred["advice"][0].startswith("cannot predict with confidence")
    assert not any("scales well" in a for a in pred["advice"])


def test_growth_is_continued_with_the_last_two_sizes_never_downwards():
    pts = [
        contention.Point(1, 10.0, 0.0, 0.0, 0.0),
        contention.Point(2, 20.0, 5.0, 1.0, 1.0),
        contention.Point(4, 18.0, 5.0, 1.0, 1.0),
    ]
    verdict = contention.assess(pts)
    assert verdict.contradicted and "18.0 ms at 4 workers (x1.8)" in verdict.reasons[0]
    row = {"workers": 8, "step_ms": 11.0, "own_ms": 10.0, "waiting_for_slowest_ms": 0.0, "allreduce_ms": 1.0}
    out = contention.correct(row, verdict, lambda n, m: 1.0)
    assert out is not None and out["own_ms"] == 18.0  # 20 → 18 does not extrapolate to less
    assert contention.correct(row, contention.assess(pts[:1]), lambda n, m: 1.0) is None  # nothing contradicts
