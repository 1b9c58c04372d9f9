"""Faults on the namespace test bed with real TensorFlow: each ends in a bounded, clean teardown.

SIGKILL of a worker, SIGSTOP of a worker, a cut network link, and a killed sshd: the right event,
the right root cause, within timeout_s + 2 s, and no process left on any host.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, read_events, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

pytestmark = [pytest.mark.e2e, requires_netns]

INTERVAL = 0.5
TIMEOUT = 5.0


def _job(tb, tmp_path, name, gather=False):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        name,
        [
            PY,
            str(WORKLOADS / "mwms_job.py"),
            "--epochs",
            "1000",
            "--steps",
            "50",
            "--step-sleep",
            "0.02",
            "--pid-dir",
            str(pid_dir),
        ],
        heartbeat={"interval_s": INTERVAL, "timeout_s": TIMEOUT},
    )
    run_dir = tmp_path / "run"
    proc = start_launch(tb, spec, run_dir, *([] if gather else ["--no-gather"]), "-q")
    try:
        wait_for(
            lambda: (
                any(e["event"] == "task_started" and e.get("how") == "progress" for e in read_events(run_dir))
                or sum(1 for e in read_events(run_dir) if e["event"] == "task_started") == 3
            ),
            180,
            "training started",
        )
        # Training steps are being made (progress heartbeats), so the job is past MWMS setup.
        wait_for(lambda: _steps(run_dir) >= 5, 120, "training steps")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    pids = {p.stem.replace("-", ":"): int(p.read_text()) for p in pid_dir.glob("*.pid")}
    return proc, run_dir, pids


def _steps(run_dir) -> int:
    path = run_dir / "heartbeats.jsonl"
    if not path.exists():
        return 0
    best = 0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        best = max(best, (rec.get("progress") or {}).get("steps") or 0)
    return best


def _finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
        raise
    return proc.returncode, out, err


def _event_ts(run_dir, kind, task=None):
    for e in read_events(run_dir):
        if e["event"] == kind and (task is None or e.get("task") == task):
            return e["ts"]
    return None


def test_sigkill_of_a_worker(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir, pids = _job(tb, tmp_path, "f-kill")
    t_kill = time.time()
    os.kill(pids["worker:1"], signal.SIGKILL)
    code, _, err = _finish(proc)
    assert code == 3, err[-2000:]
    assert_no_job_processes(tb, 10)
    t_gone = time.time()
    result = json.loads((run_dir / "result.json").read_text())
    rc = result["root_cause"]
    assert (rc["task"], rc["kind"], rc["signal"]) == ("worker:1", "signal", "SIGKILL")
    assert rc["host"] == tb.hosts[1].address
    assert t_gone - t_kill < TIMEOUT + 2
    assert _event_ts(run_dir, "teardown") - t_kill < 2.0


def test_sigstop_of_a_worker_is_hung(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir, pids = _job(tb, tmp_path, "f-stop")
    t_stop = time.time()
    os.kill(pids["worker:2"], signal.SIGSTOP)
    try:
        code, _, err = _finish(proc)
    finally:
        try:
            os.kill(pids["worker:2"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert code == 3, err[-2000:]
    hung_ts = _event_ts(run_dir, "worker_hung", "worker:2")
    assert hung_ts is not None and hung_ts - t_stop < TIMEOUT + 2
    rc = json.loads((run_dir / "result.json").read_text())["root_cause"]
    assert (rc["task"], rc["kind"]) == ("worker:2", "hung")
    assert "stopped" in rc["message"]
    assert_no_job_processes(tb, 15)


def test_cut_link_is_a_lost_worker(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir, _ = _job(tb, tmp_path, "f-cut", gather=True)
    t_cut = time.time()
    tb.cut(tb.hosts[2])
    code, _, err = _finish(proc, timeout=90)
    exited = time.time()
    assert code == 3, err[-2000:]
    lost_ts = _event_ts(run_dir, "worker_lost", "worker:2")
    assert lost_ts is not None and lost_ts - t_cut < TIMEOUT + 2
    rc = json.loads((run_dir / "result.json").read_text())["root_cause"]
    assert (rc["task"], rc["kind"]) == ("worker:2", "lost")
    # The launcher does not wait for the exit status (nor an SSH timeout) of a host it cannot hear
    # from: the whole process is gone within the heartbeat timeout and 2 s of the cut.
    assert _event_ts(run_dir, "job_finished") - t_cut < TIMEOUT + 2
    assert exited - t_cut < TIMEOUT + 2, f"launcher exited {exited - t_cut:.1f}s after the cut"
    gather = json.loads((run_dir / "result.json").read_text())["gather"]
    assert "not gathered: the host was lost" in gather["logs"]["worker:2"]
    # The cut host's worker_entry stops its task by itself: the launcher's pings stopped.
    assert_no_job_processes(tb, TIMEOUT + 15)
    tb.restore(tb.hosts[2])


def test_killed_sshd_is_a_lost_worker(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir, _ = _job(tb, tmp_path, "f-sshd")
    t_kill = time.time()
    tb.kill_sshd(tb.hosts[0])
    code, _, err = _finish(proc)
    assert code == 3, err[-2000:]
    rc = json.loads((run_dir / "result.json").read_text())["root_cause"]
    assert (rc["task"], rc["kind"]) == ("worker:0", "lost")
    assert rc["ts"] - t_kill < TIMEOUT + 2
    assert_no_job_processes(tb, TIMEOUT + 15)
