"""`tfcluster scale` end to end on the namespace test bed: 1, 2 and 3 real TensorFlow workers over
SSH, the third host's sshd (so every process it starts) in a CPU cgroup limited to a fraction of a
CPU. The sweep must measure every size, name that host as the straggler with a host-CPU cause where
it joins, show the efficiency drop it causes, and write the table, JSON, HTML and PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PY, assert_no_job_processes, repo_python, run_cli
from cpu_quota import cpu_cgroup, cpu_quota
from testbed_fixtures import requires_netns

pytestmark = [pytest.mark.e2e, requires_netns]

TRAIN = [
    PY,
    "-m",
    "worker_entry.examples.keras_synthetic",
    "--epochs",
    "100000",
    "--steps-per-epoch",
    "50",
    "--extra-matmuls",
    "20",
    "--matmul-task",
    "",
]


def test_scale_sweep_names_the_throttled_host(testbed_factory, tmp_path):
    if cpu_cgroup() is None:
        pytest.skip("no writable CPU cgroup (v1 cpu.cfs_quota_us or v2 cpu.max) on this machine")
    tb = testbed_factory(3, mode="netns")
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "sweep",
        TRAIN,
        job={"python": repo_python(tmp_path), "startup_timeout_s": 180},
        heartbeat={"interval_s": 1.0, "timeout_s": 30},
    )
    slow_host = tb.hosts[2].address
    sweep = tmp_path / "sweep"
    with cpu_quota(0.25, "tfcluster-scale-e2e") as cg:
        (cg / "cgroup.procs").write_text(str(tb.sshd_pid(2)))  # what its sshd starts inherits the quota
        out = run_cli(
            "scale",
            str(spec),
            "--workers",
            "1,2,3",
            "--duration",
            "15s",
            "--run-dir",
            str(sweep),
            "--json",
            tb=tb,
            timeout=600,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary == json.loads((sweep / "scale.json").read_text())
    sizes = {s["workers"]: s for s in summary["sizes"]}
    assert sorted(sizes) == [1, 2, 3]
    assert all(s["state"] == "succeeded" and s["examples_per_s"] for s in sizes.values()), summary
    assert summary["unit"] == "examples/s" and summary["baseline_workers"] == 1
    assert [sizes[n]["per_worker_batch"] for n in (1, 2, 3)] == [64, 64, 64]  # weak scaling, measured
    # the throttled host joins at 3 workers: named there, with its host's evidence, and nowhere before
    assert sizes[1]["straggler"] is None and sizes[2]["straggler"] is None, summary
    named = sizes[3]["straggler"]
    assert named and named["task"] == "worker:2" and named["host"] == slow_host, named
    assert named["cause"] in ("host CPU", "compute"), named
    assert sizes[3]["efficiency"] < sizes[2]["efficiency"], [(n, s["efficiency"]) for n, s in sizes.items()]
    slow = [a for a in summary["advice"] if a["advice"].startswith(f"one slow host: {slow_host}")]
    assert slow and slow[0]["size"] == "3", summary["advice"]
    # the pictures and the page
    assert Path(summary["html"]) == sweep / "scale.html"
    names = sorted(Path(p).name for p in summary["pngs"])
    # Keras fit logs its loss: the sizes' loss against the examples each trained on is drawn too
    assert names == ["loss_by_size.png", "scaling.png", "split_by_size.png", "step_times_3.png", "time_split_3.png"]
    for png in summary["pngs"]:
        assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (sweep / "scale.html").read_text().count("data:image/png;base64,") == 5  # every PNG above
    # each size is an ordinary run: report --html works on it
    rep = run_cli("report", str(sweep / "workers-3"), "--html", "--json")
    assert rep.returncode == 0, rep.stderr
    html = json.loads(rep.stdout)["html"]
    assert Path(html).exists() and "straggler" in Path(html).read_text()
    assert_no_job_processes(tb, 10)


def test_a_script_whose_global_batch_grows_with_the_replicas_is_called_weak_scaling(testbed_factory, tmp_path):
    """TF's tutorials grow the global batch with the workers and end every epoch in a partial batch
    (6,000 examples: 62.5 examples per worker per step on average at 3 workers, 64 in every full step).
    The sweep reads each size's median step batch: 64 per worker at 1 and 3, called weak scaling. (Two
    sizes are all `scaling_of` needs; a third would only add a 2-worker job's TensorFlow start-ups.)"""
    tb = testbed_factory(3, mode="netns")
    train = [PY, str(Path(__file__).parent / "workloads" / "weak_epochs.py")]
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "weak",
        train,
        job={"python": repo_python(tmp_path), "startup_timeout_s": 180},
        heartbeat={"interval_s": 1.0, "timeout_s": 30},
    )
    sweep = tmp_path / "sweep"
    out = run_cli(
        "scale", str(spec), "--workers", "1,3", "--duration", "8s", "--run-dir", str(sweep), "--json",
        tb=tb, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    sizes = {s["workers"]: s for s in summary["sizes"]}
    assert all(s["state"] == "succeeded" for s in sizes.values()), summary
    assert sorted(sizes) == [1, 3], summary
    assert [sizes[n]["global_batch"] for n in (1, 3)] == [64, 192], summary
    assert [sizes[n]["per_worker_batch"] for n in (1, 3)] == [64, 64]
    assert all(sizes[n]["batch_from"] == "median step" for n in (1, 3))
    # the partial batches are there: the examples the workers counted per step are below the full batch at 3
    assert sizes[3]["examples_per_s"] / sizes[3]["steps_per_s"] < 191.5, sizes[3]
    assert summary["measured_scaling"] == "weak"
    assert not any("strong scaling" in n for n in summary["notes"]), summary["notes"]
    assert any(n.startswith("weak scaling: the script kept its per-worker batch (64 at 1, 64 at 3)")
               for n in summary["notes"]), summary["notes"]  # fmt: skip
    assert_no_job_processes(tb, 10)
