"""examples/s for scripts that never mention tfcluster: TensorFlow's own multi-worker tutorials (Keras
``fit``, and the custom training loop) on the namespace test bed, 3 workers, batched without
``drop_remainder`` (no static batch dimension). The step clock reads each step's batch in the graph; the
figures must show per-replica batch x replicas x steps/s — live in ``status --json`` and ``/metrics``,
and for the whole run in ``status --json`` and ``report --json`` — through the real CLI.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, repo_python, run_cli, start_launch
from prometheus_client.parser import text_string_to_metric_families
from test_metrics import value
from testbed_fixtures import requires_netns
from waiting import wait_for

pytestmark = [pytest.mark.e2e, requires_netns]

PER_REPLICA = 64  # the tutorials' per_worker_batch_size (one replica per worker on a CPU)
WORKERS = 3
EXAMPLES_PER_STEP = PER_REPLICA * WORKERS
TASKS = [f"worker:{i}" for i in range(WORKERS)]


def scrape_on_controller(tb, url: str) -> dict[str, list]:
    """/metrics as the test bed's controller sees it (the launcher runs in its network namespace)."""
    fetch = (
        "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    )
    res = subprocess.run(tb.launcher_argv([PY, "-c", fetch, url]), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(res.stdout):
        out.setdefault(fam.name, [])
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _status(run_dir: Path) -> dict:
    res = run_cli("status", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _live_with_examples(run_dir: Path) -> dict | None:
    """``status --json`` once the job runs and every worker shows examples/s."""
    if not (run_dir / "plan.json").exists():
        return None
    st = _status(run_dir)
    tasks = st.get("tasks") or {}
    every = st.get("state") == "running" and all((tasks.get(t) or {}).get("examples_per_s") for t in TASKS)
    return st if every else None


def _per_step(examples_per_s: float, steps_per_s: float) -> float:
    return examples_per_s / steps_per_s


@pytest.mark.parametrize("script", ["tutorial_keras.py", "tutorial_ctl.py"])
def test_tutorials_show_examples_per_second_everywhere(testbed_factory, tmp_path, script):
    tb = testbed_factory(WORKERS, mode="netns")
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        script.removesuffix(".py").replace("_", "-"),
        [PY, str(WORKLOADS / script), "--epochs", "1000"],  # trains until the test has seen what it checks
        job={"python": repo_python(tmp_path)},
        heartbeat={"interval_s": 1.0, "timeout_s": 20, "profile_interval_s": 2},
    )
    run_dir = tmp_path / "run"
    p = start_launch(tb, spec, run_dir, "-q", "--no-gather", "--metrics-port", "0")
    try:
        # live: status --json while it trains (each worker's rate over its last second)
        live = wait_for(lambda: _live_with_examples(run_dir), 240, "examples/s in status --json", interval=0.5)
        for t in TASKS:
            task = live["tasks"][t]
            assert _per_step(task["examples_per_s"], task["steps_per_s"]) == pytest.approx(
                EXAMPLES_PER_STEP, rel=0.05
            ), task
        assert live["throughput"]["examples_per_s"] > 0
        # live: /metrics, per worker and the job's
        url = json.loads((run_dir / "launcher.json").read_text())["metrics_url"]

        def scraped() -> dict | None:
            got = scrape_on_controller(tb, url)
            every = all(value(got, "tfcluster_task_examples_per_second", task=t) for t in TASKS)
            return got if every and value(got, "tfcluster_job_examples_per_second") else None

        got = wait_for(scraped, 60, "examples/s in /metrics", interval=0.5)
        for t in TASKS:
            ex, steps = (
                value(got, "tfcluster_task_examples_per_second", task=t),
                value(got, "tfcluster_task_steps_per_second", task=t),
            )
            assert _per_step(ex, steps) == pytest.approx(EXAMPLES_PER_STEP, rel=0.05), (t, ex, steps)
        job_ex, job_steps = (
            value(got, "tfcluster_job_examples_per_second"),
            value(got, "tfcluster_job_steps_per_second"),
        )
        assert _per_step(job_ex, job_steps) == pytest.approx(EXAMPLES_PER_STEP, rel=0.05)
        stop = run_cli("stop", str(run_dir), timeout=180)
        assert stop.returncode == 0, stop.stderr
        p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.communicate()
    # the whole run: status (final snapshot) and report agree, per worker and for the job
    final = _status(run_dir)
    report = json.loads(run_cli("report", str(run_dir), "--json").stdout)
    assert final["finished"], final
    for t in TASKS:
        st, rep = final["tasks"][t], report["workers"][t]
        assert st["examples_per_s"] == rep["examples_per_s"] and st["steps_per_s"] == rep["steps_per_s"], (st, rep)
        assert _per_step(st["examples_per_s"], st["steps_per_s"]) == pytest.approx(EXAMPLES_PER_STEP, rel=0.05), st
    assert final["throughput"] == report["throughput"]
    rates = report["throughput"]
    assert _per_step(rates["examples_per_s"], rates["steps_per_s"]) == pytest.approx(EXAMPLES_PER_STEP, rel=0.05)
    text = run_cli("report", str(run_dir)).stdout
    assert "EX/s" in text and "examples/s" in text, text
    print(
        json.dumps({"script": script, "live": {t: live["tasks"][t]["examples_per_s"] for t in TASKS}, "final": rates}),
        file=sys.stderr,
    )
    assert_no_job_processes(tb, 10)
