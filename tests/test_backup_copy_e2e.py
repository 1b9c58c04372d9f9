"""The chief's host lost for good with its disk (issue 34.4): the next attempt, on a new plan with the spare
as the chief, resumes from the backup the launcher copied off that host, not from epoch 0. Real SSH, real
TensorFlow MWMS, 4 hosts of the namespace bed (one a spare).

The bed's hosts share one file system, so losing the chief's local disk is the backup directory removed
at the moment its link is cut: then no host holds any backup, and only the launcher's
copy (RUN/backup/copy-N) can bring the run back to where it was."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import PY, assert_no_job_processes, read_events, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

pytestmark = [pytest.mark.e2e, requires_netns]

EPOCH_RE = re.compile(r"\] epoch (\d+)/(\d+) ")


def epochs_in(text: str) -> list[int]:
    return [int(m.group(1)) for m in EPOCH_RE.finditer(text)]


def copied_epoch(run_dir: Path) -> int:
    """The newest epoch a complete copy in RUN/backup holds (its ``checkpoint`` state names ckpt-N)."""
    best = 0
    for state in (run_dir / "backup").glob("copy-*/files/checkpoint"):
        m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.M)
        best = max(best, int(m.group(1)) if m else 0)
    return best


def test_the_chiefs_host_lost_for_good_with_its_disk_resumes_on_the_spare_from_the_copied_backup(
    testbed_factory, tmp_path
):
    """3 workers + 1 spare: the chief's host (worker:0) is cut off for good once the launcher holds a copy
    of the epoch-2 backup, and its disk is gone with it. The spare becomes worker:0 (the chief) on a new
    plan, and every task resumes from the launcher's copy: after epoch 2, not from scratch."""
    tb = testbed_factory(4, mode="netns")
    command = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "5", "--steps-per-epoch", "100"]
    backup = tmp_path / "backup"
    doc = tb.spec_dict(
        "keep",
        [*command, "--backup"],
        heartbeat={"interval_s": 0.5, "timeout_s": 5.0},
        restart={"max_restarts": 1, "backup_dir": str(backup), "backup_copy_interval_s": 2},
    )
    doc["hosts"][-1]["spare"] = True
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_dir = tmp_path / "run"
    lost, spare = tb.hosts[0].address, tb.hosts[3].address
    proc = start_launch(tb, spec, run_dir, "-q", "--no-gather")
    try:
        # A save is copied only if the next one does not replace it during the pass (≈ 3.5 s on the loaded
        # bed, epochs 3-5 s here: some saves are never copied), and Keras deletes its backup when fit ends:
        # a run that ends first never gets its copy, and waiting on then only sits out the timeout.
        wait_for(lambda: copied_epoch(run_dir) >= 2 or proc.poll() is not None, 240, "the copy of the epoch-2 backup")
        assert copied_epoch(run_dir) >= 2, "the launcher ended before it held a copy of an epoch-2 or later save"
        tb.cut(tb.hosts[0])  # the chief's host, for good ...
        shutil.rmtree(backup)  # ... and its disk with it: no host holds a backup now
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        tb.restore(tb.hosts[0])
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    first, second = result["attempts"]
    assert (first["root_cause"]["task"], first["root_cause"]["kind"]) == ("worker:0", "lost"), first["root_cause"]
    assert second["state"] == "succeeded" and second["tasks"]["worker:0"]["host"] == spare
    events = read_events(run_dir)
    (reshaped,) = [e for e in events if e["event"] == "reshaped"]
    assert (reshaped["host"], reshaped["spare_in"], reshaped["workers_after"]) == (lost, spare, 3)
    copies = [e for e in events if e["event"] == "backup_copied"]
    assert copies and copies[0]["task"] == "worker:0" and copies[0]["files"] > 0
    assert any(e["event"] == "warning" and "seeded the backup copy" in e["message"] for e in events)
    for i in range(3):
        before = epochs_in((run_dir / "logs" / f"worker-{i}.log").read_text())
        after = epochs_in((run_dir / "logs" / f"worker-{i}.attempt-1.log").read_text())
        # resumed after an epoch the copy held (2 or later), not from scratch
        assert 3 <= after[0] <= max(before) + 1, (before, after)
        assert after[-1] == 5
    assert_no_job_processes(tb, 20)
