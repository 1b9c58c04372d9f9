"""`tfcluster launch` end to end: real sshd hosts, real paramiko, real processes, real TensorFlow."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, read_events, run_launch, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

from orchestrator.runs import RunDir, read_plan

pytestmark = pytest.mark.e2e

KERAS_DEMO = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "2", "--steps-per-epoch", "10"]


def mwms_job(*args: str) -> list[str]:
    return [PY, str(WORKLOADS / "mwms_job.py"), *args]


@pytest.mark.parametrize("mode", ["loopback", pytest.param("netns", marks=requires_netns)])
def test_three_worker_mwms_training_succeeds(testbed_factory, tmp_path, mode):
    tb = testbed_factory(3, mode=mode)
    spec = tb.write_spec(tmp_path / "spec.yaml", "train3", KERAS_DEMO)
    if mode == "netns":  # a real cluster: the same TF port on every host
        assert len({h.tf_port for h in tb.hosts}) == 1
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-3000:]
    result = r.result
    assert result["state"] == "succeeded"
    assert {t: v["state"] for t, v in result["tasks"].items()} == {f"worker:{i}": "succeeded" for i in range(3)}
    logs = result["gather"]["logs"]
    for i in range(3):
        live = r.log(f"worker-{i}")
        # every byte the worker printed (the node keeps its own copy) arrived live
        assert logs[f"worker:{i}"] == f"complete: all {len(live.encode())} bytes arrived live"
        assert f"[worker:{i}] epoch 2/2" in live, live[-2000:]
    combined = (r.run_dir / "combined.log").read_text()
    for i, h in enumerate(tb.hosts):
        assert f"[worker:{i} {h.address}]" in combined
    kinds = [e["event"] for e in r.events]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished"
    assert sum(1 for k in kinds if k == "task_started") == 3
    assert_no_job_processes(tb, 5)


def test_worker_exit_3_tears_down_every_host(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "fail3",
        mwms_job(
            "--epochs", "5", "--steps", "20", "--fail-task", "worker:1", "--fail-epoch", "1", "--pid-dir", str(pid_dir)
        ),
    )
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 3, r.stderr[-3000:]
    rc = r.result["root_cause"]
    assert rc["task"] == "worker:1" and rc["kind"] == "exit" and rc["exit_code"] == 3
    assert rc["host"] == tb.hosts[1].address
    assert any("injected failure" in line for line in rc["last_lines"])
    assert rc["last_lines"][-1] == "worker:1: last words on stderr"
    assert "root cause: worker:1" in r.stderr
    # Teardown of the survivors within a few seconds of the failure.
    events = r.events
    fail_ts = next(e["ts"] for e in events if e["event"] == "task_exited" and e["task"] == "worker:1")
    last_exit = max(e["ts"] for e in events if e["event"] == "task_exited")
    assert last_exit - fail_ts < 5.0
    # Every training process, by PID, is gone; nothing of the job is left on any host.
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 3
    assert not [p for p in pids if psutil.pid_exists(p)]
    assert_no_job_processes(tb, 5)


def test_launcher_sigkill_leaves_no_orphans(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    spec = tb.write_spec(
        tmp_path / "spec.yaml", "orphans", mwms_job("--epochs", "200", "--steps", "50", "--step-sleep", "0.01")
    )
    run_dir = tmp_path / "run"
    p = start_launch(tb, spec, run_dir, "-q")
    try:
        wait_for(
            lambda: sum(1 for e in read_events(run_dir) if e["event"] == "task_started") == 3, 120, "3 tasks started"
        )
        before = {name: len(procs) for name, procs in tb.processes_by_host().items()}
        assert all(n >= 2 for n in before.values()), before
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        t0 = time.monotonic()
        assert_no_job_processes(tb, 15)
        assert time.monotonic() - t0 < 15
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert not (run_dir / "result.json").exists()


def test_worker_that_never_starts_does_not_hang_past_startup_deadline(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    spec = tb.write_spec(
        tmp_path / "spec.yaml", "nostart", mwms_job("--never-start", "worker:2"), job={"startup_timeout_s": 25}
    )
    r = run_launch(tb, spec, tmp_path / "run", timeout=120)
    assert r.rc == 3
    rc = r.result["root_cause"]
    assert rc["kind"] == "startup_timeout" and rc["task"] == "worker:2"
    assert "did not start within 25s" in rc["message"]
    assert r.seconds < 25 + 30
    assert_no_job_processes(tb, 5)


def test_a_busy_slow_task_is_not_blamed_for_one_that_never_starts(testbed_factory, tmp_path):
    """On a loaded box a healthy task may still be importing TensorFlow at the startup deadline: its
    process is busy on the CPU, the one that never starts sleeps. The sleeping one is the root cause."""
    tb = testbed_factory(3)
    job = mwms_job("--never-start", "worker:2", "--busy-start", "worker:0", "--busy-start-s", "60")
    spec = tb.write_spec(tmp_path / "spec.yaml", "busy", job, job={"startup_timeout_s": 15})
    r = run_launch(tb, spec, tmp_path / "run", timeout=120)
    assert r.rc == 3
    rc = r.result["root_cause"]
    assert rc["kind"] == "startup_timeout" and rc["task"] == "worker:2", rc
    assert "did not start within 15s" in rc["message"]
    assert_no_job_processes(tb, 5)


NASTY = {
    "QUOTES": "it's \"quoted\" and 'single'",
    "SPACES": "  lead and trail  ",
    "SUBST": "$(touch {marker}) `touch {marker}` ${{HOME}}",
    "SEMI": "a; touch {marker}; b && c | d > e",
    "JSONISH": '{{"a": [1, 2], "b": "\\u00e9\\\\"}}',
    "UNICODE": "héllo wörld ✓",
    "EMPTY": "",
    "GLOB": "*",
}


def test_env_and_tf_config_reach_the_worker_byte_for_byte(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    marker = tmp_path / "pwned"
    env = {k: v.format(marker=marker) for k, v in NASTY.items()}
    script = (
        "import json, os\n"
        f"keys = {sorted([*env, 'TF_CONFIG'])!r}\n"
        "print('ENV ' + json.dumps({k: os.environ.get(k) for k in keys}))\n"
    )
    spec = tb.write_spec(
        tmp_path / "spec.yaml", "nasty", [PY, "-c", script], job={"env": env, "workdir": str(tmp_path)}
    )
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-2000:]
    plan = read_plan(RunDir(r.run_dir))  # the run's own record: its cluster, each task's TF_CONFIG on demand
    for i in range(2):
        line = next(ln for ln in r.log(f"worker-{i}").splitlines() if ln.startswith("ENV "))
        got = json.loads(line[4:])
        assert {k: got[k] for k in env} == env
        assert json.loads(got["TF_CONFIG"]) == plan.tf_config(f"worker:{i}")
    assert not marker.exists()
    assert not (Path.home() / "pwned").exists()


def test_100k_lines_per_worker_then_crash_nothing_lost(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # Every worker prints everything, waits until all have (so the first crash does not stop the
    # others mid-print), prints its last line and dies by SIGKILL: no chance to flush anything else.
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a peer's crash must not cut our last line\n"
        "idx = os.environ['TFCLUSTER_TASK_INDEX']\n"
        "out = sys.stdout\n"
        "for i in range(100000):\n"
        "    out.write(f'w{idx} line {i:06d}\\n')\n"
        "    if i % 10000 == 0:\n"
        "        sys.stderr.write(f'w{idx} err {i}\\n')\n"
        f"open(os.path.join({str(barrier)!r}, idx), 'w').close()\n"
        f"while len(os.listdir({str(barrier)!r})) < 3: time.sleep(0.01)\n"
        "out.write(f'w{idx} last line before crash\\n')\n"
        "out.flush()\n"
        "os.kill(os.getpid(), 9)\n"
    )
    spec = tb.write_spec(tmp_path / "spec.yaml", "lines", [PY, "-u", "-c", script], heartbeat={"timeout_s": 30})
    r = run_launch(tb, spec, tmp_path / "run", "-q")
    assert r.rc == 3
    assert r.result["root_cause"]["signal"] == "SIGKILL"
    for i in range(3):
        lines = r.log(f"worker-{i}").splitlines()
        out_lines = [ln for ln in lines if " line " in ln and "last" not in ln]
        assert out_lines == [f"w{i} line {n:06d}" for n in range(100000)]
        assert lines[-1] == f"w{i} last line before crash"
        assert [ln for ln in lines if " err " in ln] == [f"w{i} err {n}" for n in range(0, 100000, 10000)]
    combined = (r.run_dir / "combined.log").read_text()
    assert combined.count(" line ") >= 300000


@pytest.mark.parametrize(
    "sig, code, state", [(signal.SIGINT, 130, "interrupted_sigint"), (signal.SIGTERM, 143, "interrupted_sigterm")]
)
def test_signal_on_launcher_tears_down_cleanly(testbed_factory, tmp_path, sig, code, state):
    """Ctrl-C (SIGINT) or SIGTERM on the launcher: the same clean teardown, exit 130 / 143."""
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "sig", [PY, "-c", "import time\nwhile True: time.sleep(0.2)"])
    run_dir = tmp_path / "run"
    p = start_launch(tb, spec, run_dir)
    try:
        wait_for(lambda: sum(1 for e in read_events(run_dir) if e["event"] == "task_spawned") == 2, 60, "spawned")
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err[-2000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == state
    assert {t["state"] for t in result["tasks"].values()} == {"stopped"}
    assert_no_job_processes(tb, 5)


def test_command_not_found_is_a_clear_root_cause(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "nocmd", ["definitely-not-a-command-xyz", "--flag"])
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 4  # refused before the go (agent.scriptcheck): nothing ran
    rc = r.result["root_cause"]
    assert rc["kind"] == "preflight"
    assert "job.command[0]: definitely-not-a-command-xyz is not on PATH" in rc["message"]
    assert {t["state"] for t in r.result["tasks"].values()} == {"not_started"}
    # without the checks (--no-preflight) it fails as it starts, as a shell would say it
    r = run_launch(tb, spec, tmp_path / "run2", "--no-preflight")
    assert r.rc == 3
    rc = r.result["root_cause"]
    assert rc["exit_code"] == 127
    assert "definitely-not-a-command-xyz" in rc["message"]


def test_override_command_after_double_dash(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "override", ["false"])
    r = run_launch(tb, spec, tmp_path / "run", "--", PY, "-c", "print('overridden ok')")
    assert r.rc == 0, r.stderr[-2000:]
    assert "overridden ok" in r.log("worker-0")
    assert "overridden ok" in r.stdout


def test_unreachable_hosts_reported_together(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec_d = tb.spec_dict("unreach", ["true"])
    spec_d["hosts"][0]["port"] = 1  # nothing listens there
    spec_d["hosts"][1]["identity_file"] = str(tmp_path / "missing_key")
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_d))
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 4
    assert "connection refused" in r.stderr and "missing_key does not exist" in r.stderr
    assert r.result["state"] == "connect_failed"
    assert os.stat(tmp_path / "run").st_mode & 0o777 == 0o700
