"""A job that outlives its hosts (issue 34), on the namespace test bed with real TensorFlow MWMS.

3 workers + 1 spare: one host's link is cut for good in epoch 2; the job finishes on the other three,
resumed from the last backed-up epoch, exit 0, and the run names the lost host and the spare. Without
a spare and ``min_workers: 2`` it finishes on 2 workers, on the same global batch. A worker whose script
raises is restarted in place: no host is excluded.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import PY, WORKLOADS, assert_no_job_processes, backed_up_epochs, read_events, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

from orchestrator.runs import RunDir
from orchestrator.views.control import job_status, status_text
from orchestrator.views.goodput import CATEGORIES
from orchestrator.views.report import build_report, report_text

pytestmark = [pytest.mark.e2e, requires_netns]

EPOCH_RE = re.compile(r"\] epoch (\d+)/(\d+) .* batch=(\d+)")
HEARTBEAT = {"interval_s": 0.5, "timeout_s": 5.0}


def _spec(tb, path, name, command, spare: bool, **sections):
    doc = tb.spec_dict(name, command, heartbeat=HEARTBEAT, **sections)
    if spare:
        doc["hosts"][-1]["spare"] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _epochs(path) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(3))) for m in EPOCH_RE.finditer(path.read_text())]


def _finish(proc, timeout=400):
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def _cut_in_epoch_2(tb, tmp_path, spare: bool, restart: dict):
    backup = tmp_path / "backup"  # the hosts share this file system: the test reads the chief's backup
    command = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "4", "--steps-per-epoch", "40"]
    spec = _spec(
        tb,
        tmp_path / "spec.yaml",
        "elastic",
        [*command, "--backup"],
        spare,
        restart={"backup_dir": str(backup), **restart},
    )
    run_dir = tmp_path / "run"
    proc = start_launch(tb, spec, run_dir, "-q", "--no-gather")
    try:
        wait_for(lambda: backed_up_epochs(backup) >= 1, 300, "the backup of epoch 1 written")
        tb.cut(tb.hosts[2])  # worker:2's host, in epoch 2, for good
        code, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return code, err, run_dir


def test_a_host_cut_for_good_is_replaced_by_the_spare_and_the_job_resumes_from_the_backup(testbed_factory, tmp_path):
    tb = testbed_factory(4, mode="netns")
    try:
        code, err, run_dir = _cut_in_epoch_2(tb, tmp_path, spare=True, restart={"max_restarts": 1})
        assert code == 0, err[-3000:]
        lost, spare = tb.hosts[2].address, tb.hosts[3].address
        result = json.loads((run_dir / "result.json").read_text())
        first, second = result["attempts"]
        assert (first["root_cause"]["task"], first["root_cause"]["kind"]) == ("worker:2", "lost")
        assert second["state"] == "succeeded" and sorted(second["tasks"]) == ["worker:0", "worker:1", "worker:2"]
        assert second["tasks"]["worker:2"]["host"] == spare
        (reshaped,) = [e for e in read_events(run_dir) if e["event"] == "reshaped"]
        assert (reshaped["host"], reshaped["spare_in"], reshaped["workers_after"]) == (lost, spare, 3)
        status = json.loads((run_dir / "status.json").read_text())
        assert [e["host"] for e in status["elastic"]["excluded"]] == [lost] and status["elastic"]["spares"] == []
        text = status_text(job_status(RunDir(run_dir)))
        assert f"host excluded: {lost} (worker:2, attempt 0): lost: " in text and "spares left: none" in text
        rep = build_report(RunDir(run_dir))
        (r,) = rep.reshapes
        assert (r["host"], r["spare_in"]) == (lost, spare)
        # the cost of the lost host (issue 34 item 8): from its last heartbeat, so at least the heartbeat
        # timeout, to the spare's attempt's first step; the training since the epoch-1 backup redone
        assert r["loss_to_training_s"] > HEARTBEAT["timeout_s"], r
        assert r["work_redone_steps"] is not None and 0 <= r["work_redone_steps"] <= 2 * 40, r
        g = rep.goodput
        assert g is not None and g.recovery is not None
        (failed,) = [a for a in g.attempts if a.cause]
        assert (failed.cause, failed.loss_to_training_s) == ("host_lost", r["loss_to_training_s"])
        assert g.recovery["hosts_lost"] == 1 and g.seconds["host_lost_s"] > 0 and g.seconds["failure_s"] == 0
        assert sum(g.seconds[k] for k in CATEGORIES) == pytest.approx(g.wall_s, abs=0.01)
        assert "(host lost for good): loss to training again" in report_text(rep)
        plan = json.loads((run_dir / "plan.json").read_text())
        assert plan["attempt"] == 1 and [t["host"] for t in plan["tasks"]] == [h.address for h in tb.hosts[:2]] + [
            spare
        ]
        for i in range(3):
            before = _epochs(run_dir / "logs" / f"worker-{i}.log")
            after = _epochs(run_dir / "logs" / f"worker-{i}.attempt-1.log")
            # resumed after the last backed-up epoch (not from epoch 1), finished on the same global batch
            assert after[0][0] > 1 and after[0][0] <= max((e for e, _ in before), default=0) + 1, (before, after)
            assert after[-1][0] == 4 and {b for _, b in after} == {64}
        assert_no_job_processes(tb, 20)
    finally:
        tb.restore(tb.hosts[2])


def test_without_a_spare_the_job_finishes_on_min_workers_from_the_backup(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    try:
        code, err, run_dir = _cut_in_epoch_2(tb, tmp_path, spare=False, restart={"max_restarts": 1, "min_workers": 2})
        assert code == 0, err[-3000:]
        result = json.loads((run_dir / "result.json").read_text())
        _, second = result["attempts"]
        assert {t: r["host"] for t, r in second["tasks"].items()} == {
            "worker:0": tb.hosts[0].address,
            "worker:1": tb.hosts[1].address,
        }
        (reshaped,) = [e for e in read_events(run_dir) if e["event"] == "reshaped"]
        assert (reshaped["host"], reshaped["spare_in"], reshaped["workers_after"]) == (tb.hosts[2].address, None, 2)
        for i in range(2):
            before = _epochs(run_dir / "logs" / f"worker-{i}.log")
            after = _epochs(run_dir / "logs" / f"worker-{i}.attempt-1.log")
            assert after[0][0] > 1 and after[-1][0] == 4, (before, after)
            assert {b for _, b in after} == {96}  # the planned global batch, 3 x 64, over 2 workers
        assert_no_job_processes(tb, 20)
    finally:
        tb.restore(tb.hosts[2])


def test_a_worker_whose_script_raises_is_restarted_in_place_and_no_host_is_excluded(testbed_factory, tmp_path):
    tb = testbed_factory(4, mode="netns")
    command = [PY, str(WORKLOADS / "mwms_job.py"), "--epochs", "3", "--steps", "20", "--fail-task", "worker:1"]
    spec = _spec(
        tb,
        tmp_path / "spec.yaml",
        "elastic-raise",
        [*command, "--fail-epoch", "1", "--fail-attempt", "0"],
        True,
        restart={"max_restarts": 1},
    )
    run_dir = tmp_path / "run"
    code, err = _finish(start_launch(tb, spec, run_dir, "-q", "--no-gather"))
    assert code == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    first, second = result["attempts"]
    assert (first["root_cause"]["task"], first["root_cause"]["kind"], first["root_cause"]["exit_code"]) == (
        "worker:1",
        "exit",
        3,
    )
    hosts = [h.address for h in tb.hosts[:3]]
    assert [second["tasks"][f"worker:{i}"]["host"] for i in range(3)] == hosts  # the same hosts, in place
    assert not [e for e in read_events(run_dir) if e["event"] == "reshaped"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["elastic"]["excluded"] == [] and status["elastic"]["spares"] == [tb.hosts[3].address]
    assert_no_job_processes(tb, 15)
