"""The late-strategy hint end to end: a script that builds its dataset before MWMS, on 2 namespace hosts
over SSH with real TensorFlow, fails; the console, ``status`` and ``report`` say what to do and where."""

from __future__ import annotations

import json

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, read_events, run_cli, run_launch
from testbed_fixtures import requires_netns

pytestmark = [pytest.mark.e2e, requires_netns]

FIX = "create `MultiWorkerMirroredStrategy()` before any dataset, tensor or model (line 11 of late_strategy.py)"


def test_a_strategy_made_after_the_dataset_gets_the_hint_on_the_console_in_status_and_report(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    spec = tb.write_spec(tmp_path / "spec.yaml", "late-strategy", [PY, str(WORKLOADS / "late_strategy.py")])
    r = run_launch(tb, spec, tmp_path / "run", "--no-live")
    assert r.rc != 0
    assert f"hint: {FIX}" in r.stderr and f"fix: {FIX}" in r.stderr, r.stderr[-3000:]
    result = json.loads((r.run_dir / "result.json").read_text())
    assert result["root_cause"]["hint"] == FIX
    assert [e["line"] for e in read_events(r.run_dir) if e["event"] == "hint"] == [11]
    status = run_cli("status", str(r.run_dir))
    assert f"fix: {FIX}" in status.stdout, status.stdout
    report = run_cli("report", str(r.run_dir))
    assert f"fix: {FIX}" in report.stdout, report.stdout + report.stderr
    assert_no_job_processes(tb, 5)
