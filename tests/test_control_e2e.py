"""`logs --follow`, `status` and `stop` from a second process against a running job."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest
from conftest import PY, REPO, _env, assert_no_job_processes, read_events, run_cli, start_launch
from waiting import wait_for

pytestmark = pytest.mark.e2e

TICKS = 60
TICKER = (
    "import os, sys, time\n"
    "idx = os.environ['TFCLUSTER_TASK_INDEX']\n"
    f"for n in range({TICKS}):\n"
    "    print(f'w{idx} tick {n}', flush=True)\n"
    "    if n % 20 == 0: print(f'w{idx} note {n}', file=sys.stderr, flush=True)\n"
    "    time.sleep(0.08)\n"
    # then hold the job open until the test saw a follower attach to it (bounded: the test may fail first)
    "deadline = time.time() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
)


def follower(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-m", "orchestrator", "logs", *args, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=str(REPO),
    )


class Reader:
    """A follower's stdout, read line by line as it comes (what it printed so far, and when it ended)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def text(self, timeout: float) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the follower did not end with the job"
        return "".join(self.lines)


def status_of(run_dir) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def expected_lines(tb, tasks=(0, 1, 2)) -> dict[str, list[str]]:
    out = {}
    for i in tasks:
        lines = []
        for n in range(TICKS):
            lines.append(f"[worker:{i} {tb.hosts[i].address}] w{i} tick {n}")
        out[f"worker:{i}"] = lines
    return out


def per_task(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if " tick " in line:
            out.setdefault(line[1:].split(" ", 1)[0], []).append(line)
    return out


def test_logs_follow_before_and_during_a_job_then_exit(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    release = tmp_path / "release"  # the job's tasks end once this exists
    spec = tb.write_spec(tmp_path / "spec.yaml", "follow", [PY, "-c", TICKER, str(release)])
    run_dir = tmp_path / "run"
    before = follower(str(run_dir))  # the run directory does not exist yet
    launcher = start_launch(tb, spec, run_dir, "-q")
    during = filtered = None
    try:
        log = run_dir / "combined.log"
        wait_for(lambda: log.exists() and log.stat().st_size > 500, 60, "the job's first lines in combined.log")
        during = follower(str(run_dir))
        filtered = follower(str(run_dir), "--task", "worker:1", "--grep", r"tick \d*7$", "--raw")
        seen = Reader(during)
        wait_for(lambda: any(" tick " in ln for ln in seen.lines), 60, "the follower's first line")
        st = wait_for(lambda: status_of(run_dir).get("state") == "running" and status_of(run_dir), 30, "running")
        # the follower attached to the job while it ran: the job had not ended when its first line came
        assert launcher.poll() is None and not (run_dir / "result.json").exists() and not st.get("finished"), st
        release.touch()
        out_b, err_b = before.communicate(timeout=120)
        out_d = seen.text(60)
        out_f, _ = filtered.communicate(timeout=60)
        launcher.communicate(timeout=60)
    finally:
        release.touch()
        for p in (before, launcher, during, filtered):
            if p is not None and p.poll() is None:
                p.kill()
    assert launcher.returncode == 0
    assert before.returncode == 0, err_b
    want = expected_lines(tb)
    assert per_task(out_b) == want
    assert per_task(out_d) == want
    assert out_b.count(" note ") == 9  # stderr lines count too
    assert out_f.splitlines() == [f"w1 tick {n}" for n in range(TICKS) if str(n).endswith("7")]
    # and on the finished run, without --follow
    r = run_cli("logs", str(run_dir), "--task", "worker:2", "--raw")
    assert [ln for ln in r.stdout.splitlines() if "tick" in ln] == [f"w2 tick {n}" for n in range(TICKS)]
    r = run_cli("logs", "follow", "--runs-dir", str(tmp_path), "--since", "1h", "--grep", "note 40")
    assert sorted(r.stdout.splitlines()) == sorted(f"[worker:{i} {tb.hosts[i].address}] w{i} note 40" for i in range(3))


def test_status_and_stop_from_another_process(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    spec = tb.write_spec(tmp_path / "spec.yaml", "stopme", [PY, "-c", "import time\nwhile True: time.sleep(0.1)"])
    run_dir = tmp_path / "run"
    launcher = start_launch(tb, spec, run_dir)
    try:
        wait_for(
            lambda: sum(1 for e in read_events(run_dir) if e["event"] == "task_spawned") == 3, 60, "the 3 tasks spawned"
        )

        def running():
            st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
            ok = st["state"] == "running" and all(
                t["state"] == "running" and t["last_heartbeat_age_s"] is not None for t in st["tasks"].values()
            )
            return st if ok else None

        st = wait_for(running, 30, "status running")
        assert st["launcher_alive"] is True and set(st["tasks"]) == {"worker:0", "worker:1", "worker:2"}
        assert all(t["last_heartbeat_age_s"] < 5 for t in st["tasks"].values())
        human = run_cli("status", str(run_dir)).stdout
        assert "state running" in human and "worker:2" in human

        r = run_cli("stop", str(run_dir), timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("stopped: job interrupted_sigterm")
        launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 143
    assert_no_job_processes(tb, 5)
    result = json.loads((run_dir / "result.json").read_text())
    assert {t["state"] for t in result["tasks"].values()} == {"stopped"}
    st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
    assert st["finished"] is True and st["state"] == "interrupted_sigterm"
    assert run_cli("stop", str(run_dir)).stdout.startswith("the job already finished")


def test_stop_refuses_another_users_run(tmp_path, monkeypatch):
    """The run directory is 0700 and stop checks ownership: another uid is refused before any signal."""
    from orchestrator.core.errors import UsageError
    from orchestrator.runs import RunDir
    from orchestrator.views.control import stop_job

    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    (run / "launcher.json").write_text(json.dumps({"pid": os.getpid()}))
    owner = os.stat(run).st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 4242)
    with pytest.raises(UsageError, match="only the user who started the job can stop it"):
        stop_job(RunDir(run), timeout_s=1)
