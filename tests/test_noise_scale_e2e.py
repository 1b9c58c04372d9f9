"""The gradient noise scale and the training loss end to end: real MWMS over SSH on the namespace test
bed, through the real CLI.

A linear regression on Gaussian inputs with Gaussian label noise, its weights held at w = 0 (learning
rate 0): its B_simple is known in closed form (d(1 + σ²/|δ|²) + 1 = 51, ``tests/workloads/linreg_noise.py``)
and its loss too (|δ|² + σ² = 5). Three workers, Keras ``fit`` and a custom loop, nothing of tfcluster in
the script: ``report`` must give B_simple within 25 % with its standard error, and the loss curve (from
Keras's batch logs; from the value the custom loop's step function returns through ``strategy.reduce``);
``status`` shows the loss; the HTML report draws it. Then ``scale --examples --to-loss`` trains the same
model (learning rate > 0) at 1 and 3 workers on the same examples and ``predict`` bounds the steps to
the loss from the noise scale it measured."""

from __future__ import annotations

import json

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, repo_python, run_cli, run_launch
from testbed_fixtures import requires_netns

pytestmark = [pytest.mark.e2e, requires_netns]

EXACT = 51.0  # d(1 + sigma²/|delta|²) + 1 with d = 10, sigma = 2, |delta| = 1
WORKERS = 3
EXAMPLES = 48000  # the sweep's examples at every size
# the norms on every 8th step (TFCLUSTER_GRADNOISE_EVERY's default): 200 sampled steps give a standard
# error under 25 % (500 steps, 62 samples: ±16 of 51 — every step's 500 gave ±5)
STEPS = 1600


@pytest.mark.parametrize("mode", ["loop", "fit"])
def test_report_gives_the_known_noise_scale_and_the_loss_curve(testbed_factory, tmp_path, mode):
    tb = testbed_factory(WORKERS, mode="netns")
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        f"linreg-{mode}",
        [PY, str(WORKLOADS / "linreg_noise.py"), "--mode", mode, "--steps", str(STEPS), "--batch", "16"],
        job={"python": repo_python(tmp_path), "startup_timeout_s": 180},
        heartbeat={"interval_s": 1.0, "timeout_s": 30, "profile_interval_s": 2},
    )
    run_dir = tmp_path / "run"
    res = run_launch(tb, spec, run_dir, "-q", "--no-gather", timeout=400)
    assert res.rc == 0, res.stderr[-3000:]
    assert_no_job_processes(tb)
    out = run_cli("report", str(run_dir), "--json", "--html")
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout)
    ns = rep["noise_scale"]
    assert ns["b_simple"] == pytest.approx(EXACT, rel=0.25), ns
    assert ns["stderr"] is not None and 0 < ns["stderr"] < 0.25 * EXACT, ns
    assert ns["global_batch"] == 16 * WORKERS and ns["replicas"] == WORKERS and ns["kind"] == "plain"
    assert ns["every"] == 8 and STEPS // 8 - 20 <= ns["steps"] <= STEPS // 8 + 1, ns  # the sampled steps
    assert len(ns["windows"]) >= 3 and all(w["step"] for w in ns["windows"])
    loss = rep["loss"]
    assert loss["source"] == ("callback" if mode == "fit" else "stamps"), loss
    assert loss["workers"] == WORKERS and len(loss["points"]) >= 5
    assert loss["final"] == pytest.approx(5.0, rel=0.15) and ns["loss"] == pytest.approx(5.0, rel=0.15)
    assert all(p["examples"] == p["step"] * 16 * WORKERS for p in loss["points"][-3:]), loss["points"][-3:]
    # the same loss per worker in report and status (one owner: supervise.figures)
    st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
    for task, w in rep["workers"].items():
        assert w["loss"] is not None and w["loss"] == st["tasks"][task]["loss"], (task, w, st["tasks"][task])
    text = run_cli("report", str(run_dir)).stdout
    assert "B_simple ≈" in text and "training loss (" in text, text[-3000:]
    assert (run_dir / "report" / "loss.png").stat().st_size > 5000
    assert "Training loss and the gradient noise scale" in (run_dir / "report" / "report.html").read_text()


def test_scale_on_the_same_examples_and_predict_bound_the_steps_to_a_loss(testbed_factory, tmp_path):
    tb = testbed_factory(WORKERS, mode="netns")
    # Keras fit (its batch logs give the loss at one worker too), the start 3 from the optimum: the loss
    # falls from |w*|² + σ² = 13 towards 4 and reaches 6 after ~750 steps at any of these batches (measured
    # 758, 695, 678 at 1, 2, 3 workers): 48,000 examples are 3,000, 1,500 and 1,000 steps, a third more
    # than that at 3 workers (the 2- and 3-worker sizes, ~20 steps/s in namespaces, are most of the time)
    train = [PY, str(WORKLOADS / "linreg_noise.py"), "--mode", "fit", "--steps", "100000", "--batch", "16"]
    train += ["--offset", "3", "--lr", "0.0005"]
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "linreg-sweep",
        train,
        job={"python": repo_python(tmp_path), "startup_timeout_s": 180},
        heartbeat={"interval_s": 0.5, "timeout_s": 30},  # the loss curve's resolution
    )
    sweep = tmp_path / "sweep"
    # 1 and 3 workers: the 2-worker size (1,500 steps, the sweep's longest job) added no assertion of
    # its own; the bound, the noise scale and the examples-per-size trend are read at 3 against 1
    args = ["--workers", "1,3", "--examples", str(EXAMPLES), "--to-loss", "6", "--run-dir", str(sweep), "--json"]
    out = run_cli("scale", str(spec), *args, tb=tb, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    sizes = {s["workers"]: s for s in summary["sizes"]}
    assert sorted(sizes) == [1, 3] and summary["target_loss"] == 6.0
    for n, s in sizes.items():
        assert s["state"] == "succeeded", s
        assert s["loss"]["points"][-1]["examples"] >= EXAMPLES - 2 * 16 * n, (n, s["loss"]["points"][-1])
        assert s["final_loss"] < 6 and s["steps_to_loss"] and s["time_to_loss_s"] and s["examples_to_loss"], s
    assert sizes[1]["stat_efficiency"] == 1.0 and all(0 < s["stat_efficiency"] <= 1.5 for s in sizes.values())
    # the learning rate is the same at every size: more workers buy few steps, so many more examples
    assert sizes[3]["examples_to_loss"] > 1.5 * sizes[1]["examples_to_loss"], sizes
    assert sizes[1]["b_simple"] is None and "one replica" in sizes[1]["b_simple_reason"]
    assert sizes[3]["b_simple"], sizes[3]["b_simple_reason"]
    # the bound from the noise scale: at least this many steps — and the run took at least that many
    assert sizes[3]["steps_to_loss_bound"] <= sizes[3]["steps_to_loss"], sizes[3]
    text = run_cli("scale", "--help").stdout
    assert "--examples" in text and "--to-loss" in text
    page = (sweep / "scale.html").read_text()
    assert "loss_by_size" in " ".join(summary["pngs"]) and "Training loss against the examples" in page
    pred = run_cli("predict", str(sweep), "--workers", "2,4,8,16", "--network", "10Gbit,50us", "--json")
    assert pred.returncode == 0, pred.stderr[-3000:]
    p = json.loads(pred.stdout)
    rows = {r["workers"]: r for r in p["sizes"]}
    assert p["noise_scale"]["b_simple"] and all("steps_to_loss_at_least" in r for r in rows.values())
    assert rows[16]["steps_to_loss_at_least"] < rows[4]["steps_to_loss_at_least"] < 1.0  # fewer steps, bounded
    assert rows[16]["steps_to_loss_at_least"] > 3 / 16  # never better than linear from the 3 measured
    assert any("linear scaling rule" in a for a in p["advice"]), p["advice"]
    ttl = p["time_to_loss"]
    assert ttl["critical_workers"] == pytest.approx(p["noise_scale"]["b_simple"] / 16, rel=0.01)
    assert ttl["best_workers"] in [r["workers"] for r in ttl["relative_time"]]
    txt = run_cli("predict", str(sweep), "--workers", "2,4,8,16", "--network", "10Gbit,50us").stdout
    assert "STEPS TO LOSS vs 3 >=" in txt and "critical batch" in txt and "lower bounds" in txt, txt
    assert_no_job_processes(tb)
