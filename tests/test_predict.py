"""The scaling model of `tfcluster predict` against nccl-tests' published ring formulas
(NVIDIA/nccl-tests doc/PERFORMANCE.md) and hand-computed cases; its inputs read from run records;
its CLI's bad input. Pure: no TensorFlow, no hosts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.core.errors import UsageError
from orchestrator.job.scale import SweepOptions, sized_spec
from orchestrator.supervise.bound import RunBound
from orchestrator.views import predict as view
from orchestrator.views.predict_model import (
    Inputs,
    Network,
    advice,
    bus_bandwidth,
    expected_max_excess,
    parse_network,
    predict_size,
    ring_allreduce_s,
)

MBIT_200 = 200e6 / 8  # bytes/s


# ------------------------------------------------------------------------------- the ring formulas


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64, 512])
def test_bandwidth_term_is_nccl_tests_ring_allreduce(n):
    """nccl-tests: t = (S/B) * (2*(n-1)/n) at best, and busbw = algbw * 2(n-1)/n equals B; with no
    latency the model's time is exactly that, so the bus bandwidth it implies is the link's."""
    S, B = 256 * 2**20, 12.5e9
    t = ring_allreduce_s(n, S, Network(0.0, B))
    assert t == pytest.approx(S / B * (2 * (n - 1) / n), rel=1e-12)
    assert bus_bandwidth(n, S, t) == pytest.approx(B, rel=1e-12)
    assert S / t == pytest.approx(B * n / (2 * (n - 1)))  # algbw falls with n, busbw does not


def test_hand_computed_ring_times():
    net = Network(50e-6, MBIT_200)  # 200 Mbit/s, 50 us per hop
    # 2 workers, 4 MB in one pack: 2*1*50us + 2*1/2 * 4e6 / 25e6 = 0.0001 + 0.16
    assert ring_allreduce_s(2, 4e6, net) == pytest.approx(0.1601)
    # 3 workers, 2 packs: 2 * 2*2*50us + 2*2/3 * 0.16 = 0.0004 + 0.21333
    assert ring_allreduce_s(3, 4e6, net, packs=2) == pytest.approx(0.0004 + 4 / 3 * 0.16)
    # latency-bound: 8 workers, 1 KB, 5 us: 14 hops (70 us) + 1.75 * 1000/25e6 (70 us)
    assert ring_allreduce_s(8, 1000, Network(5e-6, MBIT_200)) == pytest.approx(70e-6 + 70e-6)
    assert ring_allreduce_s(1, 4e6, net) == 0.0  # one worker: nothing to all-reduce


def test_straggler_allowance_is_the_expected_slowest_of_n():
    assert expected_max_excess(1) == 0.0
    assert expected_max_excess(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)  # E[max of 2 N(0,1)]
    assert expected_max_excess(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-4)  # 3/(2 sqrt(pi))
    seq = [expected_max_excess(n) for n in (2, 4, 8, 16, 64)]
    assert seq == sorted(seq) and seq[-1] < math.sqrt(2 * math.log(64))  # grows like sqrt(2 ln n)


def test_a_size_splits_into_own_work_wait_and_allreduce_and_adds_up():
    inp = Inputs(own_ms=100.0, sigma_ms=4.0, grad_bytes=4_000_000, per_worker_batch=64)
    net = Network(50e-6, MBIT_200)
    one = predict_size(inp, net, 1)
    assert one["step_ms"] == 100.0 and one["efficiency"] == 1.0 and one["speedup"] == 1.0
    assert one["examples_per_s"] == 640.0
    two = predict_size(inp, net, 2)
    assert two["allreduce_ms"] == pytest.approx(160.1)
    assert two["waiting_for_slowest_ms"] == pytest.approx(4.0 / math.sqrt(math.pi), abs=1e-3)
    assert two["step_ms"] == pytest.approx(
        two["own_ms"] + two["waiting_for_slowest_ms"] + two["allreduce_ms"], abs=1e-3
    )
    assert two["efficiency"] == pytest.approx(100 / two["step_ms"], abs=1e-3)
    assert two["speedup"] == pytest.approx(2 * 100 / two["step_ms"], abs=1e-3)
    assert two["examples_per_s"] == pytest.approx(2 * 64 / two["step_ms"] * 1e3, abs=0.1)


def test_advice_is_computed_from_the_model():
    """16 workers, 100 ms of own work, 16 MB over 10 Gbit/s: the all-reduce dominates; the advice's
    figures are the model's own at 16 workers with the batch (own work) multiplied."""
    inp = Inputs(own_ms=20.0, sigma_ms=0.0, grad_bytes=16_000_000, per_worker_batch=32)
    net = Network(5e-6, 10e9 / 8)
    sizes = [predict_size(inp, net, n) for n in (2, 4, 8, 16)]
    lines = advice(inp, net, sizes)
    s16 = sizes[-1]
    ar = 2 * 15 * 5e-3 + 2 * 15 / 16 * 16e6 / 1.25e9 * 1e3  # ms
    assert s16["allreduce_ms"] == pytest.approx(ar, abs=1e-3)
    k = next(k for k in (2, 4, 8, 16) if 20 * k / (20 * k + ar) >= 0.8)
    want = (
        f"at 16 workers the all-reduce is {ar / (20 + ar):.0%} of a step: a {k}x larger per-worker batch would bring "
        f"efficiency from {20 / (20 + ar):.0%} to {20 * k / (20 * k + ar):.0%}"
    )
    assert lines[0].startswith(want), lines
    faster = 2 * 15 * 5e-3 + 2 * 15 / 16 * 16e6 / 5e9 * 1e3
    assert lines[0].endswith(f"a 4x faster slowest link, to {20 / (20 + faster):.0%}"), lines
    quiet = advice(
        Inputs(own_ms=500.0, sigma_ms=0.0, grad_bytes=1000), net, [predict_size(Inputs(500.0, 0.0, 1000), net, 8)]
    )
    assert quiet and quiet[0].startswith("scales well up to 8 workers")


def test_packs_pay_the_latency_each_and_the_advice_says_so():
    inp = Inputs(own_ms=5.0, sigma_ms=0.0, grad_bytes=100_000, packs=40)
    net = Network(1e-3, 100e9 / 8)
    s = predict_size(inp, net, 8)
    assert s["allreduce_ms"] == pytest.approx(40 * 14 * 1.0 + 1.75 * 100_000 / 12.5e9 * 1e3, abs=1e-3)
    assert any("40 packs pay the ring latency 40 times" in a for a in advice(inp, net, [s]))


# --------------------------------------------------------------------------------------- --network


def test_network_values():
    n = parse_network("25Gbit,5us")
    assert n.bandwidth_Bps == 25e9 / 8 and n.latency_s == pytest.approx(5e-6)
    assert parse_network("200mbit, 0.3ms").bandwidth_Bps == 25e6
    assert parse_network("1.5GB/s,2ms").bandwidth_Bps == 1.5e9
    for bad in ("25Gbit", "fast,5us", "25Gbit,5 parsecs", "0Gbit,5us", "25Gbit,5us,1"):
        with pytest.raises(ValueError, match="--network"):
            parse_network(bad)


def test_network_from_check_json_and_its_errors(tmp_path):
    check = tmp_path / "check.json"
    check.write_text(
        json.dumps(
            {
                "hosts": [],
                "allreduce": [],
                "links": [],
                "findings": [],
                "network": {"latency_s": 4e-5, "bandwidth_Bps": 2.4e7},
            }
        )
    )
    net = view.network_of(str(check), None)
    assert (net.latency_s, net.bandwidth_Bps) == (4e-5, 2.4e7) and "slowest link" in net.source
    assert view.network_of(None, None, near=[tmp_path]).bandwidth_Bps == 2.4e7  # beside the run
    assert view.network_of(str(check), "1Gbit,1us").bandwidth_Bps == 1e9 / 8  # --network wins
    with pytest.raises(UsageError, match=r"--check PATH .* or --network"):
        view.network_of(None, None, near=[tmp_path / "nothing"])
    check.write_text(json.dumps({"network": {"latency_s": 1e-5}}))
    with pytest.raises(UsageError, match=r"network\.bandwidth_Bps"):
        view.network_of(str(check), None)
    with pytest.raises(UsageError, match="no such file"):
        view.network_of(str(tmp_path / "missing.json"), None)


# -------------------------------------------------------------------------- inputs from the records


def _run_dir(tmp_path: Path, profiles: list[dict]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"task": "worker:0", "kind": "profile", "source": "stepclock", **p}) for p in profiles]
    (run / "heartbeats.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _split(step, allreduce, wait):
    return {"worker": "worker:0", "step_ms": step, "allreduce_ms": allreduce, "waiting_for_slowest_ms": wait}


def test_inputs_at_two_workers_fit_the_spread_to_the_measured_wait(tmp_path):
    run = _run_dir(
        tmp_path,
        [
            {
                "steps": 20,
                "step_ms": 300,
                "pre_collective_ms": 100,
                "grad_bytes": 4_000_000,
                "grad_tensors": 6,
                "grad_packs": 1,
                "allreduce_impl": "auto",
            }
        ],
    )
    inp = view.inputs_from(
        {"workers": 2, "run_dir": str(run), "split": _split(300.0, 180.0, 20.0), "per_worker_batch": 64}
    )
    assert inp.own_ms == 100.0 and inp.grad_bytes == 4_000_000 and inp.packs == 1 and inp.per_worker_batch == 64
    assert inp.sigma_ms == pytest.approx(20.0 * math.sqrt(math.pi), abs=1e-3)  # wait(2) = sigma / sqrt(pi)


def test_inputs_at_one_worker_take_the_spread_of_its_windows(tmp_path):
    wins = [
        {"steps": 25, "step_ms": x, "pre_collective_ms": x, "grad_bytes": 772, "grad_packs": 1}
        for x in (99, 100, 102, 98)
    ]
    run = _run_dir(tmp_path, wins)
    inp = view.inputs_from({"workers": 1, "run_dir": str(run), "split": _split(100.0, 0.0, 0.0)})
    import statistics

    assert inp.sigma_ms == pytest.approx(statistics.stdev([100, 102, 98]))  # the first window left out (warm-up)


def test_inputs_without_a_step_time_or_gradient_bytes_say_why(tmp_path):
    run = _run_dir(tmp_path, [{"steps": 20, "step_ms": 300, "pre_collective_ms": 100}])
    with pytest.raises(UsageError, match=r"no step time .*TFCLUSTER_STEPCLOCK=force"):
        view.inputs_from({"workers": 1, "run_dir": str(run), "split": None})
    with pytest.raises(UsageError, match="no gradient bytes"):
        view.inputs_from({"workers": 2, "run_dir": str(run), "split": _split(300.0, 180.0, 20.0)})


def test_a_sweeps_split_is_read_back_as_the_reports_typed_split():
    """scale.json keeps each size's split as ``JobSplit.to_dict``; predict reads it back into the type the
    report built (issue 29.3: predict reads the model), by attribute: a renamed field fails at once."""
    from orchestrator.views.split import JobSplit

    whole = JobSplit("worker:1", 300.0, 5.0, 90.0, 20.0, 180.0, 3.0, 1.0, 1.0, "worker:2", 4.0)
    assert JobSplit.from_dict(whole.to_dict()) == whole
    assert JobSplit.from_dict(json.loads(json.dumps(whole.to_dict()))) == whole  # through the file
    older = JobSplit.from_dict(_split(300.0, 180.0, 20.0))  # a file without the later parts: zero, not a crash
    assert older is not None and (older.step_ms, older.allreduce_ms, older.input_ms) == (300.0, 180.0, 0.0)
    for bad in (None, [], {}, {"step_ms": 0}, {"step_ms": "fast"}, {"step_ms": 300.0, "allreduce_ms": [1]}):
        assert JobSplit.from_dict(bad) is None, bad


def test_prediction_json_has_scale_shaped_sizes_and_errors_beside_measured_ones(tmp_path, monkeypatch):
    run = _run_dir(
        tmp_path,
        [{"steps": 20, "step_ms": 100, "pre_collective_ms": 100, "grad_bytes": 4_000_000, "grad_packs": 1}] * 3,
    )
    measured = [
        {
            "workers": 1,
            "run_dir": str(run),
            "split": _split(100.0, 0.0, 0.0),
            "per_worker_batch": 64,
            "efficiency": 1.0,
        },
        {
            "workers": 2,
            "run_dir": str(run),
            "split": _split(250.0, 150.0, 0.0),
            "per_worker_batch": 64,
            "efficiency": 0.4,
        },
    ]
    monkeypatch.setattr(view, "measured_sizes", lambda path: measured)
    pred = view.build_prediction(tmp_path, [2, 4, 8], Network(50e-6, MBIT_200, "test"))
    sizes = {s["workers"]: s for s in pred["sizes"]}
    assert sorted(sizes) == [1, 2, 4, 8]  # the measured size 1 is shown beside its prediction too
    assert sizes[2]["allreduce_ms"] == pytest.approx(160.1)
    assert sizes[2]["measured_step_ms"] == 250.0 and sizes[2]["step_error_pct"] == pytest.approx(
        100 * (260.1 - 250) / 250, abs=0.1
    )
    assert sizes[2]["allreduce_error_pct"] == pytest.approx(100 * (160.1 - 150) / 150, abs=0.1)
    assert "measured_step_ms" not in sizes[8]
    for key in ("workers", "step_ms", "examples_per_s", "steps_per_s", "speedup", "efficiency"):
        assert key in sizes[8]  # as scale.json names them
    text = view.prediction_text(pred)
    assert "assumptions:" in text and "left out: hierarchical / NCCL tree" in text and "+4%" in text
    out, lines = view.sweep_prediction({"sizes": measured}, Network(50e-6, MBIT_200, "test"))
    assert [r["workers"] for r in out["sizes"]] == [1, 2] and out["from_workers"] == 1
    assert lines[0].startswith("prediction from 1 worker(s)") and "+4%" in lines[-1]


def test_a_sweep_runs_every_size_with_the_step_clock_unless_the_spec_says_otherwise():
    from fakenode import make_plan

    loaded, _ = make_plan(2)
    opts = SweepOptions((1, 2), RunBound(seconds=20), Path("/tmp/x"))
    assert sized_spec(loaded, 1, opts).spec.job.env["TFCLUSTER_STEPCLOCK"] == "force"
    job = loaded.spec.job.model_copy(update={"env": {"TFCLUSTER_STEPCLOCK": "0"}})
    loaded = type(loaded)(
        spec=loaded.spec.model_copy(update={"job": job}), path=loaded.path, text=loaded.text, warnings=loaded.warnings
    )
    assert sized_spec(loaded, 1, opts).spec.job.env["TFCLUSTER_STEPCLOCK"] == "0"


def test_cli_bad_input_is_a_usage_error_naming_the_option(tmp_path):
    from conftest import run_cli

    out = run_cli("predict", str(tmp_path), "--workers", "2,x", "--network", "1Gbit,1us")
    assert out.returncode == 2 and "--workers '2,x'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = run_cli("predict", str(tmp_path), "--network", "fast")
    assert out.returncode == 2 and "--network 'fast'" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_curve_is_drawn_beside_the_measured_points(tmp_path):
    pytest.importorskip("matplotlib")
    from orchestrator.views.predict_plot import page

    inp = Inputs(own_ms=4.0, sigma_ms=0.4, grad_bytes=2_761_732, per_worker_batch=32)
    net = Network(4e-6, 178.9e6 / 8, "test")
    sizes = [predict_size(inp, net, n) for n in (1, 2, 3, 8)]
    sizes[1].update(measured_step_ms=151.8, measured_efficiency=0.03)
    pred = {"sizes": sizes}
    html, png = page(pred, "predicted scaling", tmp_path / "predict.html")
    assert png == tmp_path / "predict.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.read_text().count("data:image/png;base64,") == 1
