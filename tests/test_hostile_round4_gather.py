"""The gather against a hostile node or a planted run directory (a review's findings): a link at
RUN/checkpoints or at NAME.part, a FIFO there, a node that resumes from another offset than asked, two
entries on one local file, a name this disk refuses, a node that keeps the channel busy without
sending, a file that grows while it is sent. Nothing written outside RUN/, nothing hung, no verified
copy destroyed, the honest node still gathered."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from fakechannel import FakeChannel
from fakenode import make_plan
from localconn import LocalConnection
from waiting import returns_within

from orchestrator.events import EventBus
from orchestrator.runs import RunDir
from orchestrator.transfer import fetch as fetch_mod
from orchestrator.transfer import gather_after_run
from orchestrator.transfer.fetch import fetch, fetch_over, items_of, list_files
from orchestrator.transfer.paths import UnsafePath, real_dirs
from orchestrator.transfer.state import GatherState, Progress, Totals
from worker_entry import protocol as p


def _frames(path: str, data: bytes, *, size: int | None = None, offset: int = 0) -> list[bytes]:
    size = len(data) + offset if size is None else size
    out = [p.msg_frame(p.FileStart(path=path, size=size, offset=offset, mtime_ns=1))]
    out += [p.data_frame(data)] if data else []
    return [*out, p.msg_frame(p.FileEnd(path=path, size=len(data) + offset, sha256=hashlib.sha256(data).hexdigest()))]


def _node(frames: list, *, end: bool = True) -> FakeChannel:
    chan = FakeChannel()

    def feed() -> None:
        for fr in frames:
            if callable(fr):
                fr(chan)
            else:
                chan.write(fr)
        if end:
            chan.write(p.msg_frame(p.Done()))
            chan.end_output()

    threading.Thread(target=feed, daemon=True).start()
    return chan


def _fetch(dest: Path, files: list[tuple[str, int]], frames: list, **kw) -> tuple[bool, Totals]:
    totals = Totals()
    listing = p.Manifest(
        root="/node/ckpt", exists=True, files=[p.FileEntry(path=a, size=b, mtime_ns=1) for a, b in files]
    )
    items = items_of(listing, dest, totals)
    state = GatherState.load(dest.parent / "gather-state.json")
    ok = fetch_over(
        _node(frames, **kw), p.FrameDecoder(synced=True), listing.root, items, state, totals, Progress(0, False)
    )
    return ok, totals


def test_links_planted_in_the_run_are_never_written_through(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "checkpoints").symlink_to(outside)
    with pytest.raises(UnsafePath, match="checkpoints: not a directory of the run"):
        real_dirs(run, run / "checkpoints")
    assert list(outside.iterdir()) == []
    # a link at NAME.part, and a node that answers from another offset than the launcher asked
    dest = run / "nodes"
    dest.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"important data that must not change\n")
    (dest / "f.part").symlink_to(victim)
    _ok, totals = _fetch(dest, [("f", 10)], _frames("f", b"XXXXXX", offset=4, size=10))
    assert victim.read_bytes() == b"important data that must not change\n"
    assert any("not where asked" in e for e in totals.errors), totals.errors


def test_a_fifo_at_name_part_does_not_hang_the_gather(tmp_path):
    dest = tmp_path / "run" / "checkpoints"
    dest.mkdir(parents=True)
    os.mkfifo(dest / "f.part")
    _ok, totals = returns_within(20, lambda: _fetch(dest, [("f", 6)], _frames("f", b"XXXXXX")))
    assert any("not a regular file" in e for e in totals.errors), totals.errors


def test_two_entries_on_one_local_file_never_overwrite_a_verified_copy(tmp_path):
    home = tmp_path / "home"
    src = home / "ckpt"
    src.mkdir(parents=True)
    (src / "model").write_bytes(b"M" * 4000)
    (src / "model.part").write_bytes(b"P" * 1000)
    dest = tmp_path / "run" / "checkpoints"
    dest.mkdir(parents=True)
    conn = LocalConnection(home)

    def gather() -> Totals:
        (m,) = list_files(conn, "python3", [str(src)], [])
        totals = Totals()
        state = GatherState.load(tmp_path / "run" / "gather-state.json")
        fetch(conn, "python3", m.root, items_of(m, dest, totals), state, totals, Progress(0, False))
        state.save()
        return totals

    first = gather()
    assert [s["path"] for s in first.skipped] == ["model.part"] and first.errors == [], first
    (src / "model").write_bytes(b"N" * 5000)  # the next save rewrote "model"
    second = gather()
    assert second.errors == [] and (dest / "model").read_bytes() == b"N" * 5000, second
    totals = Totals()
    same = p.Manifest(
        root="/r", exists=True, files=[p.FileEntry(path=a, size=1, mtime_ns=1) for a in ("a", "./a", "b")]
    )
    assert [it.rel for it in items_of(same, dest, totals)] == ["a", "b"] and totals.skipped[0]["path"] == "./a"


def _two_nodes(tmp_path: Path, log: bytes):
    """Two tasks' node homes, each with an attempt-0 output.log: (loaded, plan, run, homes by task)."""
    loaded, plan = make_plan(2)
    run = RunDir.create(tmp_path / "run")
    homes = {}
    for n in plan.nodes:
        h = homes[str(n.task)] = tmp_path / n.task.slug
        d = h / n.remote_dir.removeprefix("~/") / "attempt-0"
        d.mkdir(parents=True)
        (d / "output.log").write_bytes(log)
    return loaded, plan, run, homes


def test_a_name_this_disk_refuses_skips_one_file_and_the_other_node_is_gathered(tmp_path):
    loaded, plan, run, homes = _two_nodes(tmp_path, b"a line\n" * 100)

    def hostile(argv):
        if argv[-1] != "manifest":
            return None
        root = str(homes["worker:1"] / plan.nodes[1].remote_dir.removeprefix("~/") / "attempt-0")
        files = [{"path": "A" * 300, "size": 1, "mtime_ns": 1}]
        return (json.dumps({"manifests": [{"root": root, "exists": True, "files": files}]}) + "\n").encode()

    conns = {"worker:0": LocalConnection(homes["worker:0"]), "worker:1": LocalConnection(homes["worker:1"], hostile)}
    summary = gather_after_run(loaded.spec, plan, conns, run, EventBus([]), attempts=1)
    assert (run.gather_dir / "worker-0" / "attempt-0" / "output.log").exists()
    assert any(s["path"] == "A" * 300 for s in summary["skipped"]), summary


def test_a_node_busy_with_noise_is_not_a_transfer(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_mod, "IDLE_TIMEOUT_S", 1.5)
    dest = tmp_path / "run" / "checkpoints"
    dest.mkdir(parents=True)

    def noise(chan: FakeChannel) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end and not chan.closed:
            chan.write_err(b"still here\n")
            time.sleep(0.2)

    start = [p.msg_frame(p.FileStart(path="f", size=10, offset=0, mtime_ns=1)), noise]
    t0 = time.monotonic()
    ok, totals = returns_within(25, lambda: _fetch(dest, [("f", 10)], start, end=False))
    assert not ok and any("no data for" in e for e in totals.errors), totals.errors
    assert time.monotonic() - t0 < 20


def test_a_file_that_grows_while_it_is_sent_is_sent_as_announced(tmp_path):
    from worker_entry.agent.files import stream_files

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "shard").write_bytes(b"a" * 1000)
    (root / "later").write_bytes(b"b" * 10)
    sent: list[bytes] = []

    def put(frame: bytes) -> None:
        sent.append(frame)
        if len(sent) == 1:  # after FileStart: the file grows
            with open(root / "shard", "ab") as f:
                f.write(b"c" * 5000)

    stream_files(str(root), [{"path": "shard", "offset": 0}, {"path": "later", "offset": 0}], put)
    frames = p.FrameDecoder(synced=True).feed(b"".join(sent))
    msgs = [p.parse(f.payload, p.TRANSFER_MESSAGES) for f in frames if f.type == p.T_MSG]
    ends = [m for m in msgs if isinstance(m, p.FileEnd)]
    assert [(m.path, m.size) for m in ends] == [("shard", 1000), ("later", 10)]
    assert sum(len(f.payload) for f in frames if f.type == p.T_DATA) == 1010


def test_every_gather_error_names_its_task_and_host(tmp_path):
    loaded, plan, run, homes = _two_nodes(tmp_path, b"x\n" * 10)

    def lying(argv):  # worker:1 lists its log one byte longer than it is: the copy fails verification
        if argv[-1] != "manifest":
            return None
        root = homes["worker:1"] / plan.nodes[1].remote_dir.removeprefix("~/") / "attempt-0"
        files = [{"path": "output.log", "size": 21, "mtime_ns": 1}]
        return (json.dumps({"manifests": [{"root": str(root), "exists": True, "files": files}]}) + "\n").encode()

    conns = {"worker:0": LocalConnection(homes["worker:0"]), "worker:1": LocalConnection(homes["worker:1"], lying)}
    summary = gather_after_run(loaded.spec, plan, conns, run, EventBus([]), attempts=1)
    assert summary["errors"] and all(e.startswith(f"worker:1 ({plan.nodes[1].host}): ") for e in summary["errors"]), (
        summary
    )
