"""Straggler detection end to end: real MWMS over SSH on the namespace test bed, step clock on.

A worker whose input pipeline is slowed (a sleep inside its tf.data map, so inside the training
step, not between steps) is flagged within 30 s of the slowdown with the right task and cause; a
homogeneous job raises no straggler event.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime

import pytest
from conftest import (
    PY,
    WORKLOADS,
    assert_no_job_processes,
    read_events,
    repo_python,
    run_cli,
    run_launch,
    start_launch,
)
from testbed_fixtures import requires_netns
from waiting import wait_for

pytestmark = [pytest.mark.e2e, requires_netns]

SLOW_LINE = "input pipeline slowed by"


def _line_ts(combined: str, needle: str) -> float | None:
    for line in combined.splitlines():
        if needle in line:
            return datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    return None


def _spec(tb, tmp_path, name, *args):
    return tb.write_spec(
        tmp_path / "spec.yaml",
        name,
        [PY, str(WORKLOADS / "mwms_job.py"), *args],
        job={"python": repo_python(tmp_path)},  # this checkout's worker_entry on the nodes
        heartbeat={"interval_s": 1.0, "timeout_s": 10, "profile_interval_s": 2},
    )


def test_slowed_input_pipeline_is_flagged_as_straggler(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    spec = _spec(
        tb,
        tmp_path,
        "strag",
        "--epochs",
        "1",
        "--steps",
        "5000",
        "--slow-task",
        "worker:1",
        "--slow-ms",
        "60",
        "--slow-after-s",
        "10",
    )
    run_dir = tmp_path / "run"
    p = start_launch(tb, spec, run_dir, "-q", "--no-gather")
    try:
        ev = wait_for(
            lambda: next((e for e in read_events(run_dir) if e["event"] == "straggler"), None),
            150,
            "straggler event",
            interval=0.5,
        )
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert ev["task"] == "worker:1" and ev["host"] == tb.hosts[1].address
    assert ev["cause"] == "input pipeline"
    assert ev["wait_ms"] > 20 and 0 < ev["share"] < 1
    slowed_at = _line_ts((run_dir / "combined.log").read_text(), SLOW_LINE)
    assert slowed_at is not None
    assert ev["ts"] - slowed_at < 30, (ev["ts"], slowed_at)
    report = json.loads(run_cli("report", str(run_dir), "--json").stdout)
    assert [s["task"] for s in report["stragglers"]] == ["worker:1"]
    assert "worker:1" in report["stragglers"][0]["message"] or report["stragglers"][0]["cause"] == "input pipeline"
    assert_no_job_processes(tb, 10)


def test_homogeneous_job_raises_no_straggler(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    spec = _spec(tb, tmp_path, "homog", "--epochs", "1", "--steps", "500")
    r = run_launch(tb, spec, tmp_path / "run", "-q", "--no-gather")
    assert r.rc == 0, r.stderr[-2000:]
    profiles = [
        json.loads(line) for line in (r.run_dir / "heartbeats.jsonl").read_text().splitlines() if '"profile"' in line
    ]
    assert len({p["task"] for p in profiles}) == 3 and len(profiles) >= 9  # the clock did run on every worker
    assert all(p.get("source") == "stepclock" for p in profiles)
    assert [e for e in r.events if e["event"] == "straggler"] == []
