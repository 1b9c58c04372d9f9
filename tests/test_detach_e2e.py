"""`launch --detach` and SIGHUP: the launcher runs on without a terminal; logs/status/stop still work."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from conftest import PY, assert_no_job_processes, read_events, run_cli, start_launch
from waiting import wait_for

pytestmark = pytest.mark.e2e

TICKER = [
    PY,
    "-c",
    "import os, time\nfor n in range(int(os.environ.get('N', '40'))):\n"
    "    print(f\"w{os.environ['TFCLUSTER_TASK_INDEX']} tick {n}\", flush=True); time.sleep(0.1)",
]


def _spec(tb, tmp_path, n=40):
    return tb.write_spec(tmp_path / "spec.yaml", "det", TICKER, job={"env": {"N": str(n)}})


def test_detach_returns_at_once_and_the_job_runs_on_in_its_own_session(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    run = tmp_path / "run"
    r = run_cli("launch", str(_spec(tb, tmp_path)), "--run-dir", str(run), "--detach", tb=tb)
    assert r.returncode == 0, r.stderr
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1))
    assert f"run directory {run}" in r.stdout and "tfcluster logs" in r.stdout
    # one run, one id: the background launcher plans with the id this command chose and printed
    run_id = re.search(r"run id (\S+)\)", r.stdout).group(1)
    assert json.loads((run / "plan.json").read_text())["run_id"] == run_id
    assert os.getsid(pid) == pid != os.getsid(0)  # its own session: no terminal can hang it up
    follow = run_cli("logs", str(run), "--follow", tb=tb, timeout=120)
    assert follow.returncode == 0
    for i in range(2):
        assert f"[worker:{i} {tb.hosts[i].address}] w{i} tick 39" in follow.stdout
    wait_for(lambda: (run / "result.json").exists(), 30, "result.json")
    assert json.loads((run / "result.json").read_text())["state"] == "succeeded"
    log = (run / "launcher.log").read_text()
    assert "job succeeded" in log and "w1 tick 39" in log
    assert_no_job_processes(tb, 5)


def test_a_detached_job_stops_like_any_other(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    run = tmp_path / "run"
    r = run_cli("launch", str(_spec(tb, tmp_path, n=3000)), "--run-dir", str(run), "--detach", tb=tb)
    assert r.returncode == 0, r.stderr

    def status():
        return json.loads(run_cli("status", str(run), "--json", tb=tb).stdout)

    wait_for(lambda: status()["state"] == "running", 60, "the job running")
    assert status()["launcher_alive"]
    stop = run_cli("stop", str(run), tb=tb, timeout=120)
    assert stop.returncode == 0 and "interrupted_sigterm" in stop.stdout
    assert_no_job_processes(tb, 5)


def test_a_bad_spec_with_detach_is_reported_here(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\n")
    r = run_cli("launch", str(bad), "--run-dir", str(tmp_path / "run"), "--detach")
    assert r.returncode == 2 and "bad.yaml" in r.stderr and not (tmp_path / "run").exists()


def test_sighup_moves_the_output_to_the_run_directory_and_the_job_goes_on(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    run = tmp_path / "run"
    proc = start_launch(tb, _spec(tb, tmp_path, n=50), run)
    try:
        wait_for(lambda: any(e["event"] == "task_spawned" for e in read_events(run)), 60, "tasks running")
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert json.loads((run / "result.json").read_text())["state"] == "succeeded"
    assert "detached" in [e["event"] for e in read_events(run)]
    log = (run / "launcher.log").read_text()
    assert "w0 tick 49" in log and "job succeeded" in log  # printed after the hangup: in the log
    assert "w0 tick 49" not in out
    assert_no_job_processes(tb, 5)
