"""Restart from backup: a killed worker, all tasks relaunched together, BackupAndRestore resumes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

import pytest
from conftest import read_events

from orchestrator.backends.ssh import close_all, connect_all
from orchestrator.events import EventBus
from orchestrator.schedulers.ssh import ssh_plan
from orchestrator.spec import load_spec
from orchestrator.transfer import sync_backup

pytestmark = pytest.mark.e2e

EPOCH_RE = re.compile(r"\] epoch (\d+)/(\d+) ")


def epochs_in(text: str) -> list[int]:
    return [int(m.group(1)) for m in EPOCH_RE.finditer(text)]


def test_killed_worker_restarts_all_tasks_and_resumes_from_backup(restarted_run):
    """worker:1 SIGKILLed in epoch 3 of 6 with 2 epochs backed up (``shared_runs.restarted_run``, the run
    test_goodput books too): every task restarts and resumes after the last epoch backed up."""
    run_dir, err = restarted_run.run_dir, restarted_run.stderr
    assert restarted_run.rc == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded" and result["restarts"] == 1
    first, second = result["attempts"]
    assert first["state"] == "failed"
    assert (first["root_cause"]["task"], first["root_cause"]["signal"]) == ("worker:1", "SIGKILL")
    assert second["state"] == "succeeded"
    assert [e["attempt"] for e in read_events(run_dir) if e["event"] == "restart"] == [1]
    for i in range(3):
        before = epochs_in((run_dir / "logs" / f"worker-{i}.log").read_text())
        after = epochs_in((run_dir / "logs" / f"worker-{i}.attempt-1.log").read_text())
        # Resumed at the epoch after the last one completed before the kill, not from scratch.
        assert after[0] == max(before) + 1 > 1, (before, after)
        assert after[-1] == 6
    # The chief's checkpoint was gathered and verified.
    assert result["gather"]["errors"] == []
    summary = json.loads((run_dir / "checkpoints" / "summary.json").read_text())
    assert summary["epochs"] == 6
    assert any((run_dir / "checkpoints").glob("model*.index"))  # (the fixture saw no job process left)


def _sha_tree(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def test_backup_sync_copies_the_chiefs_backup_where_storage_is_not_shared(testbed_factory, tmp_path):
    """Hosts with local disks: each task has its own backup directory; the chief's must reach all."""
    tb = testbed_factory(3)
    spec_path = tb.write_spec(tmp_path / "spec.yaml", "bsync", ["true"])
    spec = load_spec(spec_path).spec
    plan = ssh_plan(spec, run_id="bsync-1", local_user=tb.user)
    dirs = [tmp_path / f"host{i}" / "backup" for i in range(3)]
    local = [dataclasses.replace(n.common, backup_dir=str(d)) for n, d in zip(plan.nodes, dirs, strict=True)]
    plan = dataclasses.replace(
        plan, nodes=tuple(dataclasses.replace(n, common=c) for n, c in zip(plan.nodes, local, strict=True))
    )
    chief_dir = dirs[0] / "chief"
    (chief_dir / "sub").mkdir(parents=True)
    (chief_dir / "checkpoint").write_text("model_checkpoint_path: 'ckpt-3'\n")
    (chief_dir / "sub" / "ckpt-3.data-00000-of-00001").write_bytes(os.urandom(300_000))
    (dirs[2] / "chief").mkdir(parents=True)
    (dirs[2] / "chief" / "checkpoint").write_text("model_checkpoint_path: 'ckpt-1'\n")  # stale
    (dirs[2] / "chief" / "stale-file").write_text("from an older epoch")
    conns, failures, _ = connect_all(plan.nodes)
    try:
        assert not failures
        info = sync_backup(plan, conns, EventBus())
        assert sorted(info["synced"]) == ["worker:1", "worker:2"] and info["errors"] == []
        want = _sha_tree(chief_dir)
        for d in dirs[1:]:
            assert _sha_tree(d / "chief") == want  # same bytes, same mtimes, stale files gone
        again = sync_backup(plan, conns, EventBus())
        assert again["synced"] == [] and "already" in again["skipped"]
        assert not list((tmp_path / "host1" / "backup").glob("chief.*"))  # no temp dirs left behind
    finally:
        close_all(conns)
