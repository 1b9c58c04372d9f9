"""Before a restart: give every task the chief's BackupAndRestore state.

Keras' BackupAndRestore under MWMS writes the real backup only on the chief (`BACKUP_DIR/chief`;
the others write to temporary dirs) but *every* task reads `BACKUP_DIR/chief` when it restarts. On a
shared filesystem that is one directory; on hosts with local disks the other tasks would find no
backup, start from epoch 0 while the chief resumes, and the collectives would not match. So before
relaunching we compare each task's copy with the chief's (names, sizes, mtimes) and copy it over
where it differs, verified by sha256, swapped in atomically on the node.

``seed_backups`` is what the next attempt calls with its plan (the same one, or a new one after a host
is lost): it seeds every task from the newest complete copy the launcher kept (``backupcopy``), which
outlives the chief's host, and falls back to the chief's own backup where there is no copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from worker_entry import protocol as p

from ..backends import Connection, wait_readable
from ..events import EventBus
from ..events.kinds import JobWarning
from ..plan import NodePlan, Plan
from .backupcopy import Copy, CopyStore, signature, verify_copy
from .fetch import fetch, items_of, list_files
from .state import GatherState, Item, Progress, Totals, check_space

CHUNK = 1 << 20


_signature = signature


def push_dir(conn: Connection, python: str, items: list[Item], remote_root: str) -> dict[str, Any]:
    """Stream already-downloaded, verified ``items`` to the node into ``remote_root``.

    Only items whose local copy we made ourselves are pushed, each opened with O_NOFOLLOW: nothing
    a node names is ever opened on the launcher."""
    chan = conn.exec([python, "-m", "worker_entry", "receive"])
    try:
        chan.send(p.command_line({"root": remote_root}))
        for it in items:
            chan.send(p.msg_frame(p.FileStart(path=it.rel, mtime_ns=it.mtime_ns)))
            h = hashlib.sha256()
            fd = os.open(it.dest, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(fd, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    chan.send(p.data_frame(chunk))
            chan.send(p.msg_frame(p.FileEnd(path=it.rel, sha256=h.hexdigest())))
        chan.send(p.msg_frame(p.Done()))
        out = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(out) < (1 << 20):
            wait_readable(chan.filenos(), 1.0)
            o, _, eof = chan.read()
            out += o
            if eof:
                break
        line = out.strip().splitlines()[-1] if out.strip() else b"{}"
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        return reply if isinstance(reply, dict) else {"ok": False, "error": f"unreadable reply {line[:100]!r}"}
    finally:
        chan.close()


def sync_backup(plan: Plan, conns: Mapping[str, Connection], bus: EventBus) -> dict[str, Any]:
    """Make every task's BACKUP_DIR/chief equal to the chief's. Returns what was done."""
    chief = plan.chief
    nodes = [n for n in plan.nodes if str(n.task) in conns]
    if str(chief.task) not in conns:
        return {"synced": [], "skipped": "the chief is not reachable"}

    def listing(node: NodePlan) -> tuple[str, p.Manifest | None]:
        try:
            return str(node.task), list_files(conns[str(node.task)], node.argv[0], [f"{node.backup_dir}/chief"], [])[0]
        except Exception:
            return str(node.task), None

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        manifests = dict(pool.map(listing, nodes))
    source = manifests.get(str(chief.task))
    if source is None or not source.exists or not source.files:
        return {"synced": [], "skipped": "no backup on the chief"}
    want = _signature(source)
    targets = [
        n
        for n in nodes
        if n.task != chief.task and ((m := manifests.get(str(n.task))) is None or _signature(m) != want)
    ]
    if not targets:
        return {"synced": [], "skipped": "every task already sees the chief's backup (shared storage)"}
    tmp = Path(tempfile.mkdtemp(prefix="tfcluster-backup-"))
    try:
        totals = Totals()
        items = items_of(source, tmp, totals)
        state = GatherState(tmp / ".state")
        if not check_space(tmp, items, totals):  # the local temp directory: as the chief listed it
            raise RuntimeError("; ".join(totals.errors[:3]))
        fetch(conns[str(chief.task)], chief.argv[0], source.root, items, state, totals, Progress(0, enabled=False))
        if totals.errors:
            raise RuntimeError("; ".join(totals.errors[:3]))
        verified = [it for it in items if str(it.dest) in state.files]
        done, errors = [], []
        for node in targets:
            res = push_dir(conns[str(node.task)], node.argv[0], verified, f"{node.backup_dir}/chief")
            (done if res.get("ok") else errors).append(
                f"{node.task}" + ("" if res.get("ok") else f": {res.get('error')}")
            )
        bus.emit(
            JobWarning(
                message=f"copied the chief's backup ({len(verified)} files) to {', '.join(done) or 'no task'} before "
                "the restart" + (f"; failed: {errors}" if errors else ""),
            )
        )
        return {"synced": done, "errors": errors, "files": len(verified)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _listings(plan: Plan, conns: Mapping[str, Connection], timeout: float) -> dict[str, p.Manifest | None]:
    """Each reachable task's BACKUP_DIR/chief as its node lists it (None: the listing failed)."""
    nodes = [n for n in plan.nodes if str(n.task) in conns]

    def listing(node: NodePlan) -> tuple[str, p.Manifest | None]:
        try:
            conn = conns[str(node.task)]
            return str(node.task), list_files(conn, node.argv[0], [f"{node.backup_dir}/chief"], [], timeout=timeout)[0]
        except Exception:
            return str(node.task), None

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        return dict(pool.map(listing, nodes))


def _newest_mtime(files: Any) -> int:
    return max((f.mtime_ns or 0 for f in files), default=0)


def newest_verified(store: CopyStore, bus: EventBus) -> Copy | None:
    """The newest copy whose every file still matches its sha256; a copy that does not is named and skipped."""
    for c in store.copies():
        problems = verify_copy(c)
        if not problems:
            return c
        bus.emit(JobWarning(message=f"the backup copy {c.root} failed verification and is not used: {problems[:2]}"))
    return None


def seed_backups(
    plan: Plan, conns: Mapping[str, Connection], store: CopyStore | None, bus: EventBus, timeout: float = 60.0
) -> dict[str, Any]:
    """Before an attempt on ``plan`` (the same plan or a new one): every task's BACKUP_DIR/chief becomes
    the newest complete, verified copy in ``store``, whichever host is gone. The chief of ``plan`` keeps
    its own backup when it is newer than every copy (a save after the last copy): then that one is
    spread, as before (``sync_backup``). Without a copy, the same."""
    copy = newest_verified(store, bus) if store is not None else None
    if copy is None:
        return sync_backup(plan, conns, bus)
    found = _listings(plan, conns, timeout)
    live = found.get(str(plan.chief.task))
    if live is not None and live.files and _newest_mtime(live.files) > _newest_mtime(copy.files):
        return sync_backup(plan, conns, bus)
    want = copy.signature
    targets = [
        n
        for n in plan.nodes
        if str(n.task) in conns and ((m := found.get(str(n.task))) is None or signature(m) != want)
    ]
    if not targets:
        return {"synced": [], "copy": str(copy.root), "skipped": "every task already holds the newest copy"}
    items = copy.items()
    done, errors = [], []
    for node in targets:
        try:
            res = push_dir(conns[str(node.task)], node.argv[0], items, f"{node.backup_dir}/chief")
        except Exception as exc:
            res = {"ok": False, "error": str(exc)}
        (done if res.get("ok") else errors).append(f"{node.task}" + ("" if res.get("ok") else f": {res.get('error')}"))
    bus.emit(
        JobWarning(
            message=f"seeded the backup copy {copy.root.name} ({len(items)} files) to {', '.join(done) or 'no task'} "
            "before the attempt" + (f"; failed: {errors}" if errors else ""),
        )
    )
    return {"synced": done, "errors": errors, "files": len(items), "copy": str(copy.root)}
