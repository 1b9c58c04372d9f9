"""Before a restart: give every task the chief's BackupAndRestore state.

Keras' BackupAndRestore under MWMS writes the real backup only on the chief (`BACKUP_DIR/chief`;
the others write to temporary dirs) but *every* task reads `BACKUP_DIR/chief` when it restarts. On a
shared filesystem that is one directory; on hosts with local disks the other tasks would find no
backup, start from epoch 0 while the chief resumes, and the collectives would not match. So before
relaunching we compare each task's copy with the chief's (names, sizes, mtimes) and copy it over
where it differs, verified by sha256, swapped in atomically on the node.
"""

from __future__ import annotations

import hashlib
import json
import select
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from worker_entry import wire

from .events import EventBus
from .gather import GatherState, Progress, Totals, _items, _manifest, fetch
from .plan import NodePlan, Plan
from .transport import Connection

CHUNK = 1 << 20


def _signature(manifest: dict[str, Any]) -> list[tuple[str, int, int | None]]:
    return sorted((f["path"], f["size"], f.get("mtime_ns")) for f in manifest.get("files", []))


def push_dir(
    conn: Connection, python: str, local: Path, files: list[dict[str, Any]], remote_root: str
) -> dict[str, Any]:
    """Stream `files` (manifest entries, relative to `local`) to the node into `remote_root`."""
    chan = conn.exec([python, "-m", "worker_entry", "receive"])
    try:
        chan.send(wire.command_line({"root": remote_root}))
        for f in files:
            src = local / f["path"]
            chan.send(wire.msg_frame({"type": "file", "path": f["path"], "mtime_ns": f.get("mtime_ns")}))
            h = hashlib.sha256()
            with open(src, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    chan.send(wire.data_frame(chunk))
            chan.send(wire.msg_frame({"type": "end", "path": f["path"], "sha256": h.hexdigest()}))
        chan.send(wire.msg_frame({"type": "done"}))
        out = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            select.select(chan.filenos(), [], [], 1.0)
            o, _, eof = chan.read()
            out += o
            if eof:
                break
        line = out.strip().splitlines()[-1] if out.strip() else b"{}"
        return json.loads(line)
    finally:
        chan.close()


def sync_backup(plan: Plan, conns: dict[str, Connection], bus: EventBus) -> dict[str, Any]:
    """Make every task's BACKUP_DIR/chief equal to the chief's. Returns what was done."""
    chief = plan.chief
    nodes = [n for n in plan.nodes if str(n.task) in conns]
    if str(chief.task) not in conns:
        return {"synced": [], "skipped": "the chief is not reachable"}

    def listing(node: NodePlan) -> tuple[str, dict[str, Any] | None]:
        try:
            return str(node.task), _manifest(conns[str(node.task)], node.argv[0], [f"{node.backup_dir}/chief"], [])[0]
        except Exception:
            return str(node.task), None

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        manifests = dict(pool.map(listing, nodes))
    source = manifests.get(str(chief.task))
    if not source or not source.get("exists") or not source.get("files"):
        return {"synced": [], "skipped": "no backup on the chief"}
    want = _signature(source)
    targets = [
        n
        for n in nodes
        if n.task != chief.task and (manifests.get(str(n.task)) is None or _signature(manifests[str(n.task)]) != want)
    ]
    if not targets:
        return {"synced": [], "skipped": "every task already sees the chief's backup (shared storage)"}
    tmp = Path(tempfile.mkdtemp(prefix="tfcluster-backup-"))
    try:
        totals = Totals()
        fetch(
            conns[str(chief.task)],
            chief.argv[0],
            source["root"],
            _items(source, tmp, totals),
            GatherState(tmp / ".state"),
            totals,
            Progress(0, enabled=False),
        )
        if totals.errors:
            raise RuntimeError("; ".join(totals.errors[:3]))
        done, errors = [], []
        for node in targets:
            res = push_dir(conns[str(node.task)], node.argv[0], tmp, source["files"], f"{node.backup_dir}/chief")
            (done if res.get("ok") else errors).append(
                f"{node.task}" + ("" if res.get("ok") else f": {res.get('error')}")
            )
        bus.emit(
            "warning",
            message=f"copied the chief's backup ({len(source['files'])} files) to {', '.join(done) or 'no task'} before the restart"
            + (f"; failed: {errors}" if errors else ""),
        )
        return {"synced": done, "errors": errors, "files": len(source["files"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
