"""Gathering: verified copies, resume after interruption, hostile remote names and symlinks."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PY, REPO, _env, assert_no_job_processes, run_cli, run_launch

from orchestrator.transfer.fetch import items_of
from orchestrator.transfer.paths import UnsafePath, dest_path, safe_relpath
from orchestrator.transfer.state import Totals
from worker_entry.protocol import Manifest


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --- pure path safety ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", "", "a\x00b", "..", "a/..", "\\abs"])
def test_safe_relpath_rejects_escapes(bad):
    with pytest.raises(UnsafePath):
        safe_relpath(bad)


@pytest.mark.parametrize("ok, want", [("..hidden", "..hidden"), ("a..b", "a..b"), ("./a//b", "a/b"), ("...", "...")])
def test_safe_relpath_accepts_dotted_names(ok, want):
    assert str(safe_relpath(ok)) == want


def test_dest_path_never_writes_through_a_planted_symlink(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(UnsafePath, match="symlink"):
        dest_path(dest, "sub/file")
    (dest / "f").symlink_to(outside / "target")
    with pytest.raises(UnsafePath, match="symlink"):
        dest_path(dest, "f")
    assert dest_path(dest, "x/y/z") == dest.resolve() / "x" / "y" / "z"
    assert list(outside.iterdir()) == []


def test_hostile_manifest_entries_are_skipped(tmp_path):
    totals = Totals()
    manifest = Manifest.from_dict(
        {
            "root": "/r",
            "files": [
                {"path": "../../evil", "size": 1},
                {"path": "/etc/cron.d/x", "size": 1},
                {"path": "ok/file", "size": 3},
            ],
            "skipped": [{"path": "etc", "reason": "symlink to /etc (not followed)"}],
        }
    )
    items = items_of(manifest, tmp_path, totals)
    assert [i.rel for i in items] == ["ok/file"]
    assert {s["path"] for s in totals.skipped} == {"../../evil", "/etc/cron.d/x", "etc"}


# --- end to end over SSH ---------------------------------------------------------------------


def _chief_checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "weights.bin").write_bytes(os.urandom(1 << 20))
    for i in range(20):
        (ckpt / "model" / f"shard-{i:02d}").write_bytes(os.urandom(1000 + i))
    (ckpt / "..hidden").write_text("dotted name, stays inside")
    (ckpt / "a..b").write_text("also inside")
    (ckpt / "etc").symlink_to("/etc")
    (ckpt / "passwd").symlink_to("/etc/passwd")
    (ckpt / "model" / "up").symlink_to("../../..")
    (ckpt / "workertemp_1").mkdir()
    (ckpt / "workertemp_1" / "junk").write_text("a non-chief temporary copy")
    return ckpt


@pytest.mark.e2e
def test_gathered_checkpoint_verifies_and_nothing_escapes(testbed_factory, tmp_path):
    tb = testbed_factory(2)
    ckpt = _chief_checkpoint(tmp_path)
    spec = tb.write_spec(tmp_path / "spec.yaml", "gather1", ["true"], checkpoint={"dir": str(ckpt)})
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == 0, r.stderr[-2000:]
    dest = r.run_dir / "checkpoints"
    for src in ckpt.rglob("*"):
        rel = src.relative_to(ckpt)
        if src.is_symlink() or "workertemp_1" in rel.parts or src.is_dir():
            assert not (dest / rel).exists() or (dest / rel).is_dir()
            continue
        assert sha(dest / rel) == sha(src), rel
    assert (dest / "..hidden").read_text() == "dotted name, stays inside"
    assert not (dest / "etc").exists() and not (dest / "passwd").exists() and not (dest / "model" / "up").exists()
    assert not any(p.name.endswith(".part") for p in dest.rglob("*"))
    gather = r.result["gather"]
    reasons = {s["path"]: s["reason"] for s in gather["skipped"]}
    assert reasons["etc"] == "symlink to /etc (not followed)"
    assert reasons["passwd"] == "symlink to /etc/passwd (not followed)"
    assert reasons["model/up"] == "symlink to ../../.. (not followed)"
    # a non-chief's temporary copy is never gathered, and it is cleaned up on the node (here the
    # hosts share one filesystem, so the non-chief's cleanup may even run before the chief's listing)
    assert "excluded" in reasons.get("workertemp_1", "excluded")
    assert not (dest / "workertemp_1").exists() and not (ckpt / "workertemp_1").exists()
    assert gather["errors"] == []
    # every task's exit status came back (from its node's `exited`: result.json is its one record here)
    assert {t: v["exit_code"] for t, v in r.result["tasks"].items()} == {"worker:0": 0, "worker:1": 0}
    # the run directory holds only what we wrote: nothing created through a link
    everything = {p.relative_to(r.run_dir).parts[0] for p in r.run_dir.rglob("*")}
    assert everything <= {
        "spec.yaml",
        "plan.json",
        "launcher.json",
        "status.json",
        "events.jsonl",
        "heartbeats.jsonl",
        "combined.log",
        "logs",
        "result.json",
        "checkpoints",
        "nodes",
        "gather-state.json",
        "tensorboard",  # the launcher's own scalars (sinks.tensorboard)
        "summary.json",  # the whole-run report written at the run's end (views.runsummary)
    }


@pytest.mark.e2e
def test_interrupted_gather_resumes_without_recopying(testbed_factory, tmp_path):
    tb = testbed_factory(1)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    big = ckpt / "big.bin"
    with open(big, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    for i in range(10):
        (ckpt / f"small-{i}").write_bytes(os.urandom(4096))
    spec = tb.write_spec(tmp_path / "spec.yaml", "resume", ["true"], checkpoint={"dir": str(ckpt)})
    r = run_launch(tb, spec, tmp_path / "run", "--no-gather")
    assert r.rc == 0

    # 1) A real interruption: SIGKILL `tfcluster gather` while it copies the big file.
    dest = r.run_dir / "checkpoints"
    part = dest / "big.bin.part"
    p = subprocess.Popen(
        [PY, "-m", "orchestrator", "gather", str(r.run_dir)],
        env=_env(),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    caught = False
    try:
        while p.poll() is None:
            if part.exists() and part.stat().st_size > (4 << 20):
                p.send_signal(signal.SIGKILL)
                caught = True
                break
    finally:
        p.communicate()
    if caught:
        assert not (dest / "big.bin").exists() and part.exists()

    # 2) A deterministic interruption on top: half a file in .part, its verified record gone.
    if (dest / "big.bin").exists():
        (dest / "big.bin").unlink()
    with open(big, "rb") as src, open(part, "wb") as dst:
        dst.write(src.read(24 << 20))
    state_path = r.run_dir / "gather-state.json"
    if state_path.exists():
        state = json.loads(state_path.read_text())
        state["files"] = {k: v for k, v in state["files"].items() if not k.endswith("big.bin")}
        state_path.write_text(json.dumps(state))
    g = run_cli("gather", str(r.run_dir))
    assert g.returncode == 0, g.stderr
    summary = json.loads((r.run_dir / "result.json").read_text())["gather"]
    assert summary["resumed_files"] == 1 and summary["resumed_bytes"] == 24 << 20
    assert sha(dest / "big.bin") == sha(big)
    assert not part.exists()
    for i in range(10):
        assert sha(dest / f"small-{i}") == sha(ckpt / f"small-{i}")

    # 3) Run again: everything verified already, nothing copied.
    g = run_cli("gather", str(r.run_dir))
    assert g.returncode == 0
    summary = json.loads((r.run_dir / "result.json").read_text())["gather"]
    assert summary["files"] == 0 and summary["already_verified"] >= 11

    # 3b) A crash after a batch was written but before its renames: complete .part files, no
    #     records. They are verified where they lie and renamed; no byte is sent again.
    state = json.loads(state_path.read_text())
    for i in (0, 1):
        os.replace(dest / f"small-{i}", dest / f"small-{i}.part")
    state["files"] = {k: v for k, v in state["files"].items() if not k.endswith(("small-0", "small-1"))}
    state_path.write_text(json.dumps(state))
    g = run_cli("gather", str(r.run_dir))
    assert g.returncode == 0, g.stderr
    summary = json.loads((r.run_dir / "result.json").read_text())["gather"]
    assert summary["resumed_files"] == 2 and summary["resumed_bytes"] == 2 * 4096 and summary["files"] == 2
    for i in (0, 1):
        assert sha(dest / f"small-{i}") == sha(ckpt / f"small-{i}") and not (dest / f"small-{i}.part").exists()

    # 4) A corrupted partial copy is detected, removed, and the next gather gets it right.
    (dest / "big.bin").unlink()
    with open(part, "wb") as f:
        f.write(b"\x00" * (8 << 20))
    state = json.loads(state_path.read_text())
    state["files"] = {k: v for k, v in state["files"].items() if not k.endswith("big.bin")}
    state_path.write_text(json.dumps(state))
    g = run_cli("gather", str(r.run_dir))
    assert g.returncode == 5 and "verification failed" in g.stderr
    assert not part.exists() and not (dest / "big.bin").exists()
    g = run_cli("gather", str(r.run_dir))
    assert g.returncode == 0
    assert sha(dest / "big.bin") == sha(big)
    assert_no_job_processes(tb, 5)


@pytest.mark.parametrize("with_syncfs", [True, False])
def test_commit_makes_verified_parts_final_with_or_without_syncfs(tmp_path, monkeypatch, with_syncfs):
    from orchestrator.transfer import fetch as gather
    from orchestrator.transfer.state import GatherState, Item

    if not with_syncfs:
        monkeypatch.setattr(gather, "_SYNCFS", None)
    state = GatherState.load(tmp_path / "state.json")
    totals = Totals()
    batch = []
    for i in range(3):
        dest = tmp_path / "out" / f"f{i}"
        dest.parent.mkdir(exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        part.write_bytes(b"x" * (i + 1))
        item = Item(f"f{i}", dest, i + 1, 123)
        batch.append({"item": item, "part": part, "n": i + 1, "sha": hashlib.sha256(b"x" * (i + 1)).hexdigest()})
    gather._commit_parts(batch, state, totals)
    assert totals.errors == [] and totals.files == 3 and totals.bytes == 6
    for i in range(3):
        dest = tmp_path / "out" / f"f{i}"
        assert dest.read_bytes() == b"x" * (i + 1) and not dest.with_name(f"f{i}.part").exists()
        assert state.verified(dest, i + 1, 123)
