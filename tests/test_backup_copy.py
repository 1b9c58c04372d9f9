"""The chief's backup copied off its host (issue 34.4): incremental, verified by sha256, swapped in whole,
a torn copy never used, nothing planted in the run directory followed; and every task of the next attempt
seeded from the newest copy whichever host is gone. A real worker_entry lists and sends the files
(``localconn``: a "node" is this machine with its own HOME)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
from fakenode import make_plan
from localconn import LocalConnection

from orchestrator.events import EventBus
from orchestrator.events.kinds import BackupCopied, JobWarning
from orchestrator.transfer import backupcopy, seed_backups
from orchestrator.transfer.backupcopy import FILES, CopyStore, TornCopy, verify_copy
from orchestrator.transfer.backupkeep import BackupKeeper

PY = "python3"


class Events:
    def __init__(self) -> None:
        self.seen: list = []

    def handle(self, e) -> None:
        self.seen.append(e)

    def close(self) -> None:
        pass


def save(chief: Path, epoch: int, *, size: int = 50_000, keep_data: bool = False) -> None:
    """What tf_keras' BackupAndRestore leaves after an epoch: the checkpoint's data and index, then the
    ``checkpoint`` state file naming it (written last)."""
    (chief / "sub").mkdir(parents=True, exist_ok=True)
    if not keep_data:
        (chief / f"ckpt-{epoch}.data-00000-of-00001").write_bytes(os.urandom(size))
    (chief / f"ckpt-{epoch}.index").write_bytes(os.urandom(200))
    if not (chief / "sub" / "unchanged").exists():
        (chief / "sub" / "unchanged").write_bytes(b"the same in every save")
    (chief / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{epoch}"\n')


def node(tmp_path: Path, name: str) -> tuple[LocalConnection, Path]:
    home = tmp_path / name
    home.mkdir()
    return LocalConnection(home), home / "bk" / "chief"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_copy_is_whole_verified_and_only_changed_files_cross_again(tmp_path):
    conn, chief = node(tmp_path, "h0")
    save(chief, 1)
    store = CopyStore(tmp_path / "run" / "backup")
    first = store.take(conn, PY, "~/bk/chief", {"attempt": 0})
    assert first is not None and first.root.name == "copy-000001"
    assert tree(first.root / FILES) == tree(chief) and verify_copy(first) == []
    assert first.info["fetched"] == 4 and first.info["linked"] == 0 and first.info["attempt"] == 0
    assert store.take(conn, PY, "~/bk/chief", {}) is None  # nothing new: no copy
    time.sleep(0.01)
    save(chief, 2)
    second = store.take(conn, PY, "~/bk/chief", {})
    assert second is not None and second.seq == 2 and tree(second.root / FILES) == tree(chief)
    # ckpt-1's two files and sub/unchanged did not change: linked from copy 1 (the same inode), not fetched
    assert (second.info["fetched"], second.info["linked"]) == (3, 3)
    a, b = first.root / FILES / "sub" / "unchanged", second.root / FILES / "sub" / "unchanged"
    assert os.stat(a).st_ino == os.stat(b).st_ino
    save(chief, 3)
    third = store.take(conn, PY, "~/bk/chief", {})
    assert third is not None
    assert [c.seq for c in store.copies()] == [3, 2]  # the newest and one before it are kept
    assert not first.root.exists() and not list(store.root.glob(".incoming-*"))


def test_a_save_during_the_copy_makes_it_torn_and_nothing_of_it_is_used(tmp_path, monkeypatch):
    conn, chief = node(tmp_path, "h0")
    save(chief, 1)
    store = CopyStore(tmp_path / "backup")
    assert store.take(conn, PY, "~/bk/chief", {}) is not None
    save(chief, 2)
    real = backupcopy.fetch

    def save_then_fetch(*args, **kwargs):
        time.sleep(0.01)
        save(chief, 3)  # the chief saves again between the listing and the copy: its state file is replaced
        real(*args, **kwargs)

    monkeypatch.setattr(backupcopy, "fetch", save_then_fetch)
    with pytest.raises(TornCopy, match="replaced since it was listed"):
        store.take(conn, PY, "~/bk/chief", {})
    assert [c.seq for c in store.copies()] == [1] and not list(store.root.glob(".incoming-*"))
    monkeypatch.setattr(backupcopy, "fetch", real)
    again = store.take(conn, PY, "~/bk/chief", {})  # the next pass copies the newer save, whole
    assert again.seq == 2 and "ckpt-3" in (again.root / FILES / "checkpoint").read_text()
    assert tree(again.root / FILES) == tree(chief)


def test_an_unfinished_copy_and_a_damaged_copy_are_never_used(tmp_path):
    conn, chief = node(tmp_path, "h0")
    save(chief, 1)
    store = CopyStore(tmp_path / "backup")
    good = store.take(conn, PY, "~/bk/chief", {})
    time.sleep(0.01)
    save(chief, 2)
    newest = store.take(conn, PY, "~/bk/chief", {})
    # a crash while assembling copy 3: files there, no rename, no manifest
    (store.root / ".incoming-3" / FILES).mkdir(parents=True)
    (store.root / ".incoming-3" / FILES / "checkpoint").write_text("half")
    assert store.newest().seq == 2
    # a bit flipped in the newest copy (same size): its sha256 no longer matches; the one before is used
    data = newest.root / FILES / "ckpt-2.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert any("sha256" in p for p in verify_copy(newest))
    assert store.newest(verify=True).seq == good.seq == 1


def test_a_link_planted_in_the_run_directory_is_never_followed(tmp_path):
    conn, chief = node(tmp_path, "h0")
    save(chief, 1)
    store = CopyStore(tmp_path / "backup")
    first = store.take(conn, PY, "~/bk/chief", {})
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * len(b"the same in every save"))  # same size: only the link check stops it
    planted = first.root / FILES / "sub" / "unchanged"
    planted.unlink()
    planted.symlink_to(secret)
    assert any("unchanged" in p for p in verify_copy(first))  # verification does not read through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store.root / "copy-000009").symlink_to(elsewhere)  # a planted "newer copy" is no copy
    (store.root / ".incoming-2").symlink_to(elsewhere)  # nor is a planted place to assemble one
    assert [c.seq for c in store.copies()] == [1]
    time.sleep(0.01)
    save(chief, 2, keep_data=True)
    second = store.take(conn, PY, "~/bk/chief", {})
    copied = second.root / FILES / "sub" / "unchanged"
    assert not copied.is_symlink() and copied.read_bytes() == b"the same in every save"  # fetched again
    assert verify_copy(second) == [] and second.seq > 1 and list(elsewhere.iterdir()) == []


def local_plan(tmp_path: Path, n: int = 3):
    """A plan of ``n`` tasks whose backup dirs are on each node's own disk (``~`` is each node's HOME)."""
    _, plan = make_plan(n, restart={"max_restarts": 1, "backup_dir": "~/bk"})
    conns = {}
    for i, nd in enumerate(plan.nodes):
        home = tmp_path / f"h{i}"
        home.mkdir()
        conns[str(nd.task)] = LocalConnection(home)
    c = dataclasses.replace(plan.common, argv=(PY, *plan.common.argv[1:]))
    plan = dataclasses.replace(plan, common=c, nodes=tuple(dataclasses.replace(nd, common=c) for nd in plan.nodes))
    return plan, conns


def test_the_next_attempt_resumes_from_the_copy_when_the_chiefs_host_is_gone(tmp_path):
    plan, conns = local_plan(tmp_path)
    chief_task = str(plan.chief.task)
    chief_dir = tmp_path / "h0" / "bk" / "chief"
    save(chief_dir, 2)
    events = Events()
    keeper = BackupKeeper(CopyStore(tmp_path / "run" / "backup"), conns.get, interval_s=0)
    keeper.start(plan, attempt=0)
    copy = keeper.copy_once()
    assert copy is not None
    (drained,) = keeper.drain()
    assert isinstance(drained, BackupCopied) and drained.task == chief_task and drained.files == 4
    # the chief's host is gone for good: no connection, and its disk with it
    alive = {t: c for t, c in conns.items() if t != chief_task}
    info = seed_backups(plan, alive, keeper.store, EventBus([events]))
    assert sorted(info["synced"]) == sorted(alive) and info["errors"] == []
    for i in (1, 2):
        assert tree(tmp_path / f"h{i}" / "bk" / "chief") == tree(copy.root / FILES)
    assert any(isinstance(e, JobWarning) and "seeded the backup copy" in e.message for e in events.seen)
    again = seed_backups(plan, alive, keeper.store, EventBus())
    assert again["synced"] == [] and "already" in again["skipped"]


def test_a_chiefs_save_newer_than_every_copy_wins(tmp_path):
    plan, conns = local_plan(tmp_path)
    chief_dir = tmp_path / "h0" / "bk" / "chief"
    save(chief_dir, 1)
    store = CopyStore(tmp_path / "run" / "backup")
    store.take(conns[str(plan.chief.task)], PY, "~/bk/chief", {})
    time.sleep(0.01)
    save(chief_dir, 2)  # saved after the last copy, the chief still there
    info = seed_backups(plan, conns, store, EventBus())
    assert sorted(info["synced"]) == ["worker:1", "worker:2"]
    assert tree(tmp_path / "h1" / "bk" / "chief") == tree(chief_dir)
    assert "ckpt-2" in (tmp_path / "h2" / "bk" / "chief" / "checkpoint").read_text()


def test_a_keeper_pass_on_a_host_out_of_reach_keeps_the_copies(tmp_path):
    plan, conns = local_plan(tmp_path, 2)
    save(tmp_path / "h0" / "bk" / "chief", 1)
    keeper = BackupKeeper(CopyStore(tmp_path / "backup"), conns.get, interval_s=0)
    keeper.start(plan, 0)
    assert keeper.copy_once() is not None
    keeper.connection = lambda task: None
    assert keeper.copy_once() is None and "cannot be reached" in keeper.problem
    assert keeper.store.newest().seq == 1


def test_plan_says_whether_the_backup_is_copied_off_the_chiefs_host():
    from orchestrator.plan import PlanNotes, plan_text

    notes = PlanNotes(started_by=lambda n: "  remote: x")
    for shared, want in ((False, "copied to RUN/backup/"), (True, "nothing is copied")):
        _, plan = make_plan(2, restart={"backup_shared": shared})
        assert plan.common.backup_shared is shared
        (line,) = [x for x in plan_text(plan, notes).splitlines() if x.startswith("  backup:")]
        assert want in line and plan.common.backup_dir in line
