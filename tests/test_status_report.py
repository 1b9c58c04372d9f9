"""A finished run's `status` and its `report` show the same per-task figures, to the digit: the final
status snapshot holds the whole-run figures of the accumulator the supervisor fed live, and `report`
feeds the same accumulator the same records from heartbeats.jsonl.

- a job over fake nodes, with a restart (two attempts' windows);
- a recorded run directory of a real 3-worker MWMS custom loop (tests/data/recorded_run), through
  the real CLI;
- the same on a fresh real run on the namespace test bed (e2e).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from fakenode import FakeBackend, FakeNode, make_plan, stopped
from shared_runs import CUSTOM_LOOP_STEPS
from testbed_fixtures import requires_netns

from orchestrator.job import Job, LaunchOptions
from orchestrator.runs import RunDir
from orchestrator.supervise.figures import FIGURE_KEYS, TaskFigures
from orchestrator.views.control import job_status
from orchestrator.views.report import build_report
from worker_entry import protocol as p

RECORDED = Path(__file__).parent / "data" / "recorded_run"
TASKS = ("worker:0", "worker:1", "worker:2")


def assert_same_figures(status: dict[str, Any], report: dict[str, Any], tasks=TASKS) -> None:
    """Every per-task figure both show is equal; the training figures are there (not both None)."""
    st, rep = status["tasks"], report["workers"]
    assert set(tasks) <= set(st) and set(tasks) <= set(rep), (sorted(st), sorted(rep))
    for task in tasks:
        shared = set(st[task]) & set(rep[task])
        # the training loss only where the node reports one (a status.json recorded before it has none)
        optional = {"loss"} if rep[task].get("loss") is None else set()
        assert (set(FIGURE_KEYS) | {"host"}) - optional <= shared, (task, sorted(shared))
        diff = {k: (st[task][k], rep[task][k]) for k in shared if st[task][k] != rep[task][k]}
        assert not diff, (task, diff)
        for k in set(FIGURE_KEYS) - optional:
            assert st[task][k] is not None, (task, k)


def assert_synchronous(status: dict[str, Any]) -> None:
    """One synchronous job: its workers' rates are (nearly) one, and agree with its step time."""
    figs = [status["tasks"][t] for t in TASKS]
    rates = [f["steps_per_s"] for f in figs]
    assert max(rates) / min(rates) < 1.02, rates
    for f in figs:
        assert 0.5 < f["steps_per_s"] * f["step_time_s"] < 1.2, f  # a step is what one step takes


# --- fake nodes: a restart ----------------------------------------------------------------------


def trains(fails_in_attempt_0: bool = False):
    """Steps together with its peers (the wall clock paces them), a profile window every 10 beats,
    heartbeats with ragged phases per task; in attempt 0 worker:1 fails after ~1.3 s."""

    def script(n: FakeNode) -> None:
        n.hello()
        cmd = n.wait_for(p.Go)
        if not isinstance(cmd, p.Go):
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=2000 + n.node.task.index))
        n.send(p.Started(how="strategy"))
        t0 = time.time()
        time.sleep(0.02 * n.node.task.index)
        for beat in range(1, 60):
            now = time.time()
            steps = int((now - t0) * 40) + 1
            n.heartbeat(
                state="running", cpu_pct=90.0 + beat % 7, progress=p.Progress(steps=steps, examples=32 * steps, ts=now)
            )
            if beat % 10 == 0:
                n.send(
                    p.Profile(
                        steps=10,
                        ts=now,
                        step_ms=25.0 + n.node.task.index,
                        input_ms=1.0,
                        compute_ms=4.0,
                        collective_ms=18.0,
                        update_ms=0.5,
                        host_ms=1.5 + n.node.task.index,
                        other_ms=0.0,
                    )
                )
            cmd = n.next_command(0.05)
            if isinstance(cmd, p.Stop) or n.eof:
                stopped(n, cmd)
                return
            if fails_in_attempt_0 and n.config.attempt == 0 and now - t0 > 1.3:
                n.exited(1)
                return
        n.exited(0)

    return script


def test_a_finished_job_over_fake_nodes_shows_the_reports_figures(tmp_path):
    loaded, plan = make_plan(3, restart={"max_restarts": 1})
    backend = FakeBackend({"worker:0": trains(), "worker:1": trains(fails_in_attempt_0=True), "worker:2": trains()})
    opts = LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False)
    result = Job(loaded, plan, opts, backend).run()
    assert result.state.value == "succeeded" and len(result.attempts) == 2, result.root_cause
    run = RunDir(tmp_path / "run")
    status, report = job_status(run), build_report(run)
    assert_same_figures(status, report.to_dict())
    for task in TASKS:  # status reads its rows back into the report's type: the same figures, field by field
        assert TaskFigures.from_dict(status["tasks"][task]) == replace(report.workers[task].figures, split=None)
    assert json.loads(run.status_json.read_text())["tasks"] == status["tasks"]  # read as written: no second merge
    for task in TASKS:
        t = status["tasks"][task]
        assert t["state"] == "succeeded" and t["exit_code"] == 0  # the outcome from the result
        assert "gpus" not in t and "last_heartbeat_age_s" not in t  # nothing live of a finished task
        assert 30 < t["steps_per_s"] < 45 and t["examples_per_s"] == pytest.approx(32 * t["steps_per_s"], rel=0.01)
        assert t["steps"] > 90  # both attempts' steps
    records = [json.loads(x) for x in run.heartbeats_jsonl.read_text().splitlines()]
    assert {r["attempt"] for r in records} == {0, 1}


# --- a recorded real run, through the CLI -------------------------------------------------------


def _cli_json(*args: str) -> dict[str, Any]:
    out = run_cli(*args, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_the_recorded_custom_loop_run_status_and_report_agree(tmp_path):
    """A real 3-worker MWMS custom loop (`worker_entry/examples/custom_loop.py`), recorded: status.json
    as its launcher wrote it, report from its heartbeats.jsonl."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    status, report = _cli_json("status", str(run)), _cli_json("report", str(run))
    assert status["finished"] and status["state"] == "succeeded"
    assert_same_figures(status, report)
    assert_synchronous(status)


# --- a fresh real run ---------------------------------------------------------------------------


@pytest.mark.e2e
@requires_netns
def test_a_fresh_custom_loop_run_status_and_report_agree(custom_loop_run):
    """The session's homogeneous custom loop on 3 workers (``shared_runs.custom_loop_run``)."""
    r = custom_loop_run
    assert r.rc == 0, r.stderr[-3000:]
    status, report = _cli_json("status", str(r.run_dir)), _cli_json("report", str(r.run_dir))
    assert_same_figures(status, report)
    assert_synchronous(status)
    assert {status["tasks"][t]["steps"] for t in TASKS} == {CUSTOM_LOOP_STEPS}
