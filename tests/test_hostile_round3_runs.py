"""A shared runs directory with a neighbour in it (issue 31, item 10), through the real CLI.

Before: a FIFO named plan.json hung everyone's `tfcluster status`, and `status NAME` resolved a job
name to the newest readable run of any owner (it showed a run another uid planted). Now every run file
is opened with O_NONBLOCK and must be a regular file (a FIFO or a device is "not a regular file": a
damaged row, a clear refusal), and a job name resolves to the caller's own runs first; another user's
run, when it is the only one, is shown with a note saying whose it is.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import run_cli

OTHER = 54321
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's run needs root")


def _run(base, name, job, state="succeeded", uid=None, age_s=0.0):
    d = base / name
    d.mkdir(mode=0o700)
    (d / "plan.json").write_text(json.dumps({"job": job, "run_id": name, "nodes": []}))
    (d / "result.json").write_text(json.dumps({"job": job, "run_id": name, "state": state, "tasks": {}}))
    when = time.time() - age_s
    os.utime(d / "plan.json", (when, when))
    if uid is not None:  # a neighbour's run, readable by all: it wants to be found
        for f in [d, *d.iterdir()]:
            os.chown(f, uid, uid)
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
    return d


@pytest.fixture
def runs(tmp_path):
    base = tmp_path / "runs"
    base.mkdir(mode=0o1777)
    return base


def test_a_fifo_named_plan_json_hangs_nobodys_status(runs):
    _run(runs, "mine-1", "mine")
    trap = runs / "trap-1"
    trap.mkdir()
    os.mkfifo(trap / "plan.json")
    os.mkfifo(trap / "status.json")
    listed = run_cli("status", "--runs-dir", str(runs), "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {r["run_dir"].rsplit("/", 1)[1]: r for r in json.loads(listed.stdout)["runs"]}
    assert rows["mine-1"]["state"] == "succeeded"
    assert rows["trap-1"]["state"] == "damaged" and "not a regular file" in rows["trap-1"]["root_cause"]
    named = run_cli("status", str(trap), timeout=60)
    assert named.returncode != 0 and "Traceback" not in named.stderr, named.stderr
    assert "not a tfcluster run" in named.stderr


def test_other_run_files_that_are_fifos_do_not_hang_status_logs_or_report(runs):
    d = _run(runs, "mine-1", "mine")
    (d / "result.json").unlink()
    for name in ("status.json", "events.jsonl", "combined.log", "heartbeats.jsonl", "launcher.json"):
        os.mkfifo(d / name)
    for argv in (("status", str(d)), ("logs", str(d)), ("report", str(d), "--json")):
        r = run_cli(*argv, timeout=60)
        assert "Traceback" not in r.stderr, (argv, r.stderr)


@root_only
def test_a_name_resolves_to_my_own_run_before_a_newer_one_a_neighbour_planted(runs):
    mine = _run(runs, "bert-1", "bert", age_s=3600)
    _run(runs, "bert-2", "bert", state="failed", uid=OTHER)  # newer, and not mine
    r = run_cli("status", "bert", "--runs-dir", str(runs), "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["run_dir"].endswith("bert-1") and shown["state"] == "succeeded", shown
    assert "note" not in r.stderr
    assert mine.exists()


@root_only
def test_a_neighbours_run_found_by_name_says_whose_it_is(runs):
    _run(runs, "gpt-1", "gpt", uid=OTHER)
    for argv in (("status", "gpt"), ("report", "gpt", "--json")):
        r = run_cli(*argv, "--runs-dir", str(runs), timeout=60)
        assert f"is a run of uid {OTHER}, not one of yours" in r.stderr, (argv, r.stderr)
