"""`tfcluster status` without RUN: the recent runs under --runs-dir, newest first — read from each run's
small files, live runs through their handle, damaged and foreign directories and other users' runs
tolerated (a note, never a traceback); and on the test bed, a real live run and a finished one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import PY, run_cli, start_launch
from waiting import wait_for

from orchestrator.runs import RunDir, resolve_run
from orchestrator.runs.launcher import process_start_time
from orchestrator.views import runs as runs_view
from orchestrator.views.handle import RunHandle
from orchestrator.views.runs import list_runs, runs_text


def _run(
    base: Path,
    name: str,
    *,
    job: str,
    tasks: int = 2,
    result: dict | None = None,
    status: dict | None = None,
    launcher: dict | None = None,
    scheduler: str | None = None,
    command: list[str] | None = None,
) -> Path:
    d = base / name
    d.mkdir(parents=True, mode=0o700)
    nodes = [
        {"task": {"type": "worker", "index": i}, "command": command or ["python", "train.py"]} for i in range(tasks)
    ]
    plan = {"job": job, "run_id": name, "nodes": nodes}
    if scheduler:
        plan["scheduler"] = scheduler
    (d / "plan.json").write_text(json.dumps(plan))
    for fname, data in (("result.json", result), ("status.json", status), ("launcher.json", launcher)):
        if data is not None:
            (d / fname).write_text(json.dumps(data))
    return d


def _me() -> dict:
    """launcher.json of a live launcher: this very process."""
    return {"pid": os.getpid(), "create_time": process_start_time(os.getpid()), "started": time.time() - 65}


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    base = tmp_path / "runs"
    base.mkdir()
    now = time.time()
    _run(base, "ok-1", job="ok", result={"state": "succeeded", "started_ts": now - 3600, "wall_time_s": 61.5})
    _run(
        base,
        "bad-1",
        job="bad",
        tasks=3,
        result={
            "state": "failed",
            "started_ts": now - 1800,
            "wall_time_s": 12.0,
            "root_cause": {"task": "worker:1", "message": "exited with code 3\nTraceback ..."},
        },
    )
    _run(base, "live-1", job="live", status={"state": "running"}, launcher=_me())
    _run(
        base,
        "gone-1",
        job="gone",
        status={"state": "running"},
        launcher={"pid": 2**22 + 7, "create_time": 1.0, "started": now - 600},
    )
    damaged = _run(base, "damaged-1", job="damaged")
    (damaged / "plan.json").write_text("{not json")
    (base / "notes").mkdir()  # a foreign directory: passed over
    (base / "notes" / "todo.txt").write_text("x")
    (base / "README").write_text("a file, not a run")
    sweep = base / "scale-ok-1"
    sweep.mkdir()
    (sweep / "scale.json").write_text("{}")
    _run(sweep, "workers-2", job="ok", result={"state": "succeeded", "started_ts": now - 7200, "wall_time_s": 30})
    return base


def test_lists_every_run_newest_first_with_state_and_root_cause(runs_dir):
    listing = list_runs(runs_dir, RunHandle, limit=None)
    by_job = {r.job or r.state: r for r in listing.runs}
    assert by_job["live"].state == "running" and by_job["live"].wall_time_s >= 65 and by_job["live"].tasks == 2
    assert by_job["gone"].state == "launcher_gone"
    assert by_job["bad"].state == "failed" and by_job["bad"].tasks == 3
    assert by_job["bad"].root_cause == "worker:1: exited with code 3"
    ok = next(r for r in listing.runs if r.run_dir.endswith("ok-1"))
    assert ok.state == "succeeded" and ok.wall_time_s == 61.5
    assert by_job["damaged"].state == "damaged" and "not JSON" in by_job["damaged"].root_cause
    assert sum(1 for r in listing.runs if r.job == "ok") == 2  # the sweep's size is a run too
    started = [r.started for r in listing.runs]
    assert started == sorted(started, reverse=True)
    assert any("damaged" in n for n in listing.notes)
    assert not any(r.run_dir.endswith(("notes", "README", "scale-ok-1")) for r in listing.runs)
    text = runs_text(listing)
    assert text.splitlines()[0].split() == ["JOB", "STATE", "STARTED", "WALL", "TASKS", "ROOT", "CAUSE", "RUN", "DIR"]
    assert "1m02s" in text and "worker:1: exited with code 3" in text


def test_filter_by_state_and_limit(runs_dir):
    listing = list_runs(runs_dir, RunHandle, states={"failed", "succeeded"}, limit=2)
    assert [r.state for r in listing.runs] == ["failed", "succeeded"] and listing.total == 3
    assert "1 older not shown" in runs_text(listing)
    assert runs_text(list_runs(runs_dir, RunHandle, states={"pending"})).startswith("no runs in these states")


def test_other_users_runs_are_skipped_with_a_note(runs_dir, monkeypatch):
    """Run directories are 0700: another user's cannot be read (root reads them all, so denied here)."""
    private = str(runs_dir / "bad-1")
    real = os.access
    monkeypatch.setattr(runs_view.os, "access", lambda p, mode: False if str(p) == private else real(p, mode))
    listing = list_runs(runs_dir, RunHandle, limit=None)
    assert "bad" not in {r.job for r in listing.runs}
    assert any("1 run directory of other users skipped" in n for n in listing.notes)


def test_a_handle_that_fails_costs_one_row_not_the_list(runs_dir):
    class Broken(RunHandle):
        def alive(self) -> bool:
            raise RuntimeError("squeue: command not found")

    listing = list_runs(runs_dir, Broken, limit=None)
    live = next(r for r in listing.runs if r.job == "live")
    assert live.state == "unknown" and "squeue: command not found" in live.root_cause
    assert {r.state for r in listing.runs if r.job == "ok"} == {"succeeded"}


def test_cli_lists_runs_as_text_and_json(runs_dir):
    res = run_cli("status", "--runs-dir", str(runs_dir), "--json", "--limit", "0")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["total"] == 6 and len(data["runs"]) == 6
    assert set(data["runs"][0]) == {
        "job",
        "state",
        "started",
        "wall_time_s",
        "tasks",
        "root_cause",
        "run_dir",
        "run_id",
        "scheduler",
        "purpose",
    }
    res = run_cli("status", "--runs-dir", str(runs_dir), "--state", "failed")
    assert res.returncode == 0 and "bad" in res.stdout and "ok " not in res.stdout, res.stdout
    res = run_cli("status", "some-run", "--state", "failed", "--runs-dir", str(runs_dir))
    assert res.returncode == 2 and "without RUN" in res.stderr
    res = run_cli("status", "--runs-dir", str(runs_dir / "nowhere"))
    assert res.returncode == 0 and "no runs directory" in res.stdout


@pytest.mark.e2e
def test_a_real_run_is_listed_live_and_after(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "listed", [PY, "-c", "import time; time.sleep(600)"])
    runs = tmp_path / "runs"
    run_dir = runs / "listed-1"
    p = start_launch(tb, spec, run_dir, "-q", "--no-gather")
    try:

        def running() -> dict | None:
            res = run_cli("status", "--runs-dir", str(runs), "--json", "--state", "running")
            rows = json.loads(res.stdout)["runs"] if res.returncode == 0 else []
            return rows[0] if rows else None

        row = wait_for(running, 120, "the run listed as running", interval=0.5)
        assert row["job"] == "listed" and row["tasks"] == 2 and row["run_dir"] == str(run_dir)
        assert run_cli("stop", str(run_dir)).returncode == 0
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    rows = json.loads(run_cli("status", "--runs-dir", str(runs), "--json").stdout)["runs"]
    assert [(r["job"], r["state"]) for r in rows] == [
        ("listed", json.loads((run_dir / "result.json").read_text())["state"])
    ]
    assert rows[0]["wall_time_s"] > 0 and RunDir(run_dir).is_finished()


CHECK = [PY, "-m", "worker_entry.check", "--deadline-s", "60"]


def test_a_check_run_does_not_shadow_the_jobs_training_run(tmp_path):
    """`tfcluster check` after a training run: the job's name still means the training run (status, report,
    logs), the check run is reachable by its directory, and the list marks it."""
    base = tmp_path / "runs"
    base.mkdir()
    now = time.time()
    train = _run(base, "b-keras-20260101T000000Z", job="b-keras", result={"state": "failed", "started_ts": now - 60})
    check = _run(
        base,
        "check-b-keras-20260101T000100Z",
        job="b-keras",
        command=CHECK,
        result={"state": "succeeded", "started_ts": now},
    )
    os.utime(train / "plan.json", (now - 60, now - 60))  # the check is the newer run
    assert RunDir(check).path == resolve_run(str(check), base).path  # by its directory: the check itself
    assert resolve_run("b-keras", base).path == train
    res = run_cli("status", "b-keras", "--runs-dir", str(base), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["run_dir"] == str(train) and json.loads(res.stdout)["state"] == "failed"
    res = run_cli("status", str(check))
    assert res.returncode == 0 and res.stdout.startswith("job b-keras (a check run)"), res.stdout
    listing = list_runs(base, RunHandle, limit=None)
    assert {Path(r.run_dir).name: r.purpose for r in listing.runs} == {train.name: "train", check.name: "check"}
    assert "b-keras (check)" in runs_text(listing)
    only_checks = tmp_path / "only"
    only_checks.mkdir()
    lone = _run(only_checks, "check-solo-1", job="solo", command=CHECK, result={"state": "succeeded"})
    assert resolve_run("solo", only_checks).path == lone  # nothing else of that name: the check run
