"""The console collapses what every rank says, end to end: real TensorFlow on 3 namespace hosts over SSH.
A line every worker printed (after an all-reduce: within the window) is one console line with the set of
tasks; TensorFlow's start-up banner is hidden there; the per-task logs and combined.log keep every line."""

from __future__ import annotations

import re

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, run_launch
from testbed_fixtures import requires_netns

from orchestrator.sinks.collapse import NOISE_NOTE

pytestmark = [pytest.mark.e2e, requires_netns]

SAYS = "every rank says: 3 replicas answered"


def test_a_line_every_worker_printed_is_one_console_line_and_every_log_keeps_it(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    spec = tb.write_spec(tmp_path / "spec.yaml", "every-rank", [PY, str(WORKLOADS / "every_rank_says.py")])
    r = run_launch(tb, spec, tmp_path / "run", "--no-live")
    assert r.rc == 0, r.stderr[-3000:]
    console = r.stdout.splitlines()
    assert [ln for ln in console if SAYS in ln] == [f"[worker:0-2] {SAYS}"], r.stdout
    for i in range(3):  # what only one said keeps its own prefix
        host = tb.hosts[i].address
        assert f"[worker:{i} {host}] only worker:{i} says this" in console, r.stdout
    assert "cpu_feature_guard" not in r.stdout and "absl::InitializeLog" not in r.stdout
    assert r.stdout.count(NOISE_NOTE.decode().strip()) == 1
    combined = (r.run_dir / "combined.log").read_text()
    assert len(re.findall(rf"\[worker:\d \S+\] {SAYS}$", combined, flags=re.M)) == 3
    for i in range(3):
        own = r.log(f"worker-{i}")
        assert SAYS in own and "absl::InitializeLog" in own  # nothing lost: the banner is in the record
    assert_no_job_processes(tb, 5)
