"""The chief's host lost with its disk (issue 34.4): the next attempt resumes from the backup the launcher
copied off that host, not from epoch 0. Real SSH, real TensorFlow MWMS, 3 hosts of the namespace bed.

The bed's hosts share one file system, so losing the chief's local disk is the backup directory removed
at the moment its training process is killed: then no host holds any backup, and only the launcher's
copy (RUN/backup/copy-N) can bring the run back to where it was."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from conftest import PY, assert_no_job_processes, read_events, start_launch, training_pid
from waiting import wait_for

pytestmark = pytest.mark.e2e

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


def test_the_chiefs_host_lost_with_its_disk_resumes_from_the_copied_backup(testbed_factory, tmp_path):
    tb = testbed_factory(3)
    command = [
        PY,
        "-m",
        "worker_entry.examples.keras_synthetic",
        "--epochs",
        "5",
        "--steps-per-epoch",
        "200",
        "--backup",
    ]
    backup = tmp_path / "backup"
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "keep",
        command,
        restart={"max_restarts": 1, "backup_dir": str(backup), "backup_copy_interval_s": 2},
    )
    run_dir = tmp_path / "run"
    proc = start_launch(tb, spec, run_dir, "-q")
    try:
        wait_for(lambda: copied_epoch(run_dir) >= 2, 240, "the launcher's copy of the epoch-2 backup")
        pid = wait_for(lambda: training_pid(tb, tb.hosts[0]), 60, "the chief's training pid")
        os.kill(pid, signal.SIGKILL)  # the chief's host dies ...
        shutil.rmtree(backup)  # ... and its disk with it: no host holds a backup now
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded" and result["restarts"] == 1
    assert result["attempts"][0]["root_cause"]["task"] == "worker:0"
    events = read_events(run_dir)
    copies = [e for e in events if e["event"] == "backup_copied"]
    assert copies and copies[0]["task"] == "worker:0" and copies[0]["files"] > 0
    assert any(e["event"] == "warning" and "seeded the backup copy" in e["message"] for e in events)
    for i in range(3):
        before = epochs_in((run_dir / "logs" / f"worker-{i}.log").read_text())
        after = epochs_in((run_dir / "logs" / f"worker-{i}.attempt-1.log").read_text())
        # resumed after an epoch the copy held (2 or later), not from scratch
        assert 3 <= after[0] <= max(before) + 1, (before, after)
        assert after[-1] == 5
    assert_no_job_processes(tb, 5)
