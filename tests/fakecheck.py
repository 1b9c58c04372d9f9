"""`tfcluster check` through the real ``Job`` (supervisor, decoder, log router, judgement) with fake
nodes (unit tier): the one setup the check's tests share (test_check_lag, test_hostile_round3_check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakenode import FakeBackend, make_plan

from orchestrator.job import Job, LaunchOptions
from orchestrator.job.check import CheckOutcome, CheckScheduling, check_spec
from orchestrator.job.scheduling import RunScheduling
from orchestrator.schedulers.ssh import ssh_plan


def check_through_job(
    tmp_path: Path, scripts: dict[str, Any], n: int = 3, deadline_s: float | None = None
) -> tuple[dict, dict, Any, Path]:
    """Run the check of ``n`` made-up hosts whose nodes play ``scripts`` (task -> FakeNode script):
    (check.json, result.json, the loaded spec, the run directory). check.json is what the outcome holds."""
    loaded, _ = make_plan(n)
    checked = check_spec(loaded, 30)
    plan = ssh_plan(checked.spec, run_id="check-run", local_user="me", ssh_lookup=None)
    outcome = CheckOutcome()
    run = tmp_path / "run"
    opts = LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False)
    sched = CheckScheduling(RunScheduling(), outcome, deadline_s)
    Job(checked, plan, opts, FakeBackend(scripts), scheduling=sched).run()
    result = json.loads((run / "result.json").read_text())
    check = json.loads((run / "check.json").read_text())
    assert outcome.check == check
    return check, result, loaded, run
