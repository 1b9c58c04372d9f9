"""A node never makes the launcher write more than it declared, nor more than the disk has (minus a margin).

The hand-over of a task's log runs for real (fake node, real supervisor, job, decoder and writer);
the small disk is a real tmpfs; the backup sync's local copy goes through a real worker_entry."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from fakenode import FakeBackend, FakeNode, make_plan
from localconn import LocalConnection

from orchestrator.events import EventBus
from orchestrator.job import Job, LaunchOptions
from orchestrator.transfer import sync_backup
from orchestrator.transfer.state import KEEP_FREE, free_bytes
from worker_entry import protocol as p

PB = 10**15  # 1000 TB


def hands_over(size: int, *, stream: int = 0, on_fetch=None):
    """A task that ends, declares an ``output.log`` of ``size`` bytes and, when asked, streams ``stream``."""

    def script(n: FakeNode) -> None:
        n.hello()
        if not isinstance(n.wait_for(p.Go), p.Go):
            return
        n.send(p.Spawned(pid=5))
        n.log("the only line that arrived live")
        n.exited(0)
        listing = p.Manifest(
            root="/node/task", exists=True, files=[p.FileEntry("output.log", size), p.FileEntry("exit.json", 2)]
        )
        n.send(p.TaskFiles(task_dir=listing, log_bytes=size))
        while (cmd := n.next_command(20)) is not None and not isinstance(cmd, p.Bye):
            if not isinstance(cmd, p.Fetch):
                continue
            if on_fetch is not None:
                on_fetch()
            for req in cmd.files:
                data = b"{}" if req.path == "exit.json" else b"z" * stream
                frames = [p.msg_frame(p.FileStart(path=req.path, size=2 if req.path == "exit.json" else size))]
                frames += [p.data_frame(data[at : at + (256 << 10)]) for at in range(0, len(data), 256 << 10)]
                frames.append(
                    p.msg_frame(p.FileEnd(path=req.path, sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
                )
                if not all(_write(n, frame) for frame in frames):
                    return
            _write(n, p.msg_frame(p.Done()))

    return script


def _write(n: FakeNode, data: bytes) -> bool:
    """Like the node's writer, but giving up once the launcher closed the channel (it stopped reading)."""
    os.set_blocking(n.chan._w, False)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(n.chan._w, view) :]
        except BlockingIOError:
            if n.chan.closed:
                return False
            time.sleep(0.005)
        except OSError:
            return False
    return True


def run_job(run: Path, script) -> tuple[dict, FakeBackend]:
    loaded, plan = make_plan(1)
    backend = FakeBackend({"worker:0": script})
    Job(loaded, plan, LaunchOptions(run_dir=str(run), live=False, echo_logs=False), backend).run()
    return json.loads((run / "result.json").read_text()), backend


def parts(run: Path) -> dict[str, int]:
    return {str(f.relative_to(run)): f.stat().st_size for f in run.rglob("*.part")}


def test_a_log_declared_larger_than_the_disk_is_never_asked_for(tmp_path):
    run = tmp_path / "run"
    res, backend = run_job(run, hands_over(PB, stream=8 << 20))
    assert res["state"] == "succeeded"  # the task's own end is not the transfer's
    errors = " ".join(res["gather"]["errors"])
    assert "not enough space" in errors and "1000000000.0 MB to copy" in errors
    assert "not enough space to fetch them" in res["gather"]["logs"]["worker:0"]
    node = backend.nodes["worker:0"]
    assert not any(isinstance(c, p.Fetch) for c in node.received)
    assert parts(run) == {}


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_log_that_fit_when_declared_stops_before_the_disk_is_full(small_fs):
    """The log fits when the node lists it; then something else fills the disk: the copy stops with the
    margin still free (without the guard it would write until ENOSPC)."""
    run = small_fs / "run"
    filler = small_fs / "filler"

    def fill() -> None:  # between the listing and the data: leave 3 MiB
        with open(filler, "wb") as f:
            f.write(b"\0" * ((free_bytes(small_fs) or 0) - (3 << 20)))

    res, _ = run_job(run, hands_over(8 << 20, stream=8 << 20, on_fetch=fill))
    assert "not enough space in" in " ".join(res["gather"]["errors"])
    assert (free_bytes(small_fs) or 0) >= KEEP_FREE - (256 << 10)  # at most one data frame past the check
    assert all(size < 8 << 20 for size in parts(run).values())


def test_a_node_never_writes_more_than_it_declared(tmp_path):
    run = tmp_path / "run"
    res, _ = run_job(run, hands_over(1 << 20, stream=4 << 20))
    assert "more bytes than the 1048576 listed" in " ".join(res["gather"]["errors"])
    assert all(size <= 1 << 20 for size in parts(run).values())


def test_the_backup_sync_checks_the_local_space_before_it_fetches(tmp_path):
    _, plan = make_plan(2, restart={"max_restarts": 1, "backup_dir": "~/backup"})
    chief_home, worker_home = tmp_path / "chief", tmp_path / "worker"
    (chief_home / "backup" / "chief").mkdir(parents=True)
    (chief_home / "backup" / "chief" / "ckpt-1.data").write_bytes(b"small")
    worker_home.mkdir()
    asked: list[str] = []

    def huge(argv):
        asked.append(argv[-1])
        if argv[-1] != "manifest":
            return None
        files = [{"path": "ckpt-1.data", "size": PB}]
        return (
            json.dumps({"manifests": [{"root": str(chief_home / "backup" / "chief"), "exists": True, "files": files}]})
            + "\n"
        ).encode()

    conns = {"worker:0": LocalConnection(chief_home, huge), "worker:1": LocalConnection(worker_home)}
    with pytest.raises(RuntimeError, match="not enough space"):
        sync_backup(plan, conns, EventBus([]))
    assert "send" not in asked  # nothing was fetched into the local temporary directory
