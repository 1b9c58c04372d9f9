"""Bring back every task's complete log and exit status, and the chief's checkpoints. Verified.

Per file: the node streams it with the sha256 of the whole file; we hash what we write, into
`NAME.part`, and rename only when size and sha256 match. An interrupted gather resumes: verified
files are recorded in RUN/gather-state.json (with the node's size and mtime) and not copied again,
and a `.part` file continues from where it stopped. Remote names are hostile input: absolute paths
and `..` never leave the destination, and nothing is written through a symlink.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import select
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from worker_entry import wire

from .events import EventBus
from .plan import NodePlan, Plan
from .rundir import RunDir, write_json_atomic
from .transport import Connection

TEMP_PREFIX = "workertemp_"
IDLE_TIMEOUT_S = 60.0


class UnsafePath(ValueError):
    pass


def safe_relpath(rel: str) -> PurePosixPath:
    """A remote relative path we accept, or UnsafePath: no absolute, no '..', no NUL, not empty."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UnsafePath(f"bad file name {rel!r}")
    if rel.startswith("/") or rel.startswith("\\"):
        raise UnsafePath(f"absolute path {rel!r}")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise UnsafePath(f"path {rel!r} would leave the destination")
    return PurePosixPath(*parts)


def dest_path(base: Path, rel: str) -> Path:
    """base/rel, creating real directories only; refuses anything that resolves outside base."""
    rp = safe_relpath(rel)
    base = base.resolve()
    cur = base
    for part in rp.parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePath(f"{cur} is a symlink; refusing to write through it")
        cur.mkdir(mode=0o700, exist_ok=True)
    target = base.joinpath(*rp.parts)
    if target.is_symlink():
        raise UnsafePath(f"{target} is a symlink; refusing to write through it")
    real_parent = Path(os.path.realpath(target.parent))
    if real_parent != base and base not in real_parent.parents:
        raise UnsafePath(f"{rel!r} resolves outside {base}")
    return target


@dataclass
class GatherState:
    """Verified files by destination path, with the node-side size and mtime they were copied at."""

    path: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    _saved_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, path: Path) -> GatherState:
        try:
            data = json.loads(path.read_text())
            return cls(path, dict(data.get("files", {})))
        except (OSError, ValueError):
            return cls(path)

    def verified(self, dest: Path, size: int, mtime_ns: int | None) -> bool:
        rec = self.files.get(str(dest))
        return bool(
            rec
            and rec["size"] == size
            and rec.get("mtime_ns") == mtime_ns
            and dest.is_file()
            and dest.stat().st_size == size
        )

    def record(self, dest: Path, size: int, mtime_ns: int | None, sha256: str) -> None:
        with self._lock:
            self.files[str(dest)] = {"size": size, "mtime_ns": mtime_ns, "sha256": sha256}
            due = time.monotonic() - self._saved_at > 1.0
        if due:
            self.save()

    def save(self) -> None:
        with self._lock:
            snapshot = dict(self.files)
            self._saved_at = time.monotonic()
        write_json_atomic(self.path, {"files": snapshot}, indent=None)


@dataclass
class Item:
    rel: str  # path under the remote root
    dest: Path
    size: int
    mtime_ns: int | None


@dataclass
class Totals:
    files: int = 0
    bytes: int = 0
    skipped_verified: int = 0
    resumed_files: int = 0
    resumed_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: Totals) -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.skipped_verified += other.skipped_verified
        self.resumed_files += other.resumed_files
        self.resumed_bytes += other.resumed_bytes
        self.errors += other.errors
        self.skipped += other.skipped


class Progress:
    """A byte progress bar on a terminal, silence elsewhere."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        enabled = sys.stderr.isatty() and os.environ.get("TERM") != "dumb" if enabled is None else enabled
        self._bar = None
        self._lock = threading.Lock()
        if enabled and total > 0:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._bar = Progress("gathering", BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("gather", total=total)

    def advance(self, n: int) -> None:
        if self._bar is not None and n:
            with self._lock:
                self._bar.advance(self._task, n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


BATCH_FILES = 256
BATCH_BYTES = 256 << 20


class _PartWriter(threading.Thread):
    """Writes, hashes, syncs and renames received files off the receive loop.

    hashlib, file writes and fsync release the GIL, so this overlaps with paramiko decrypting the
    next packets; a bounded queue keeps memory flat when the disk is slower than the network.
    Verified files are made durable in batches (one ``syncfs`` for up to BATCH_FILES files or
    BATCH_BYTES, then the renames): an fsync per file costs one journal commit each, which for a
    checkpoint of thousands of small files took longer than the transfer.
    """

    def __init__(self, state: GatherState, totals: Totals, progress: Progress) -> None:
        super().__init__(name="gather-writer", daemon=True)
        self.q: queue.Queue = queue.Queue(maxsize=64)
        self.state = state
        self.totals = totals
        self.progress = progress
        self.cur: dict[str, Any] | None = None
        self.pending: list[dict[str, Any]] = []
        self.pending_bytes = 0

    def _commit(self, force: bool = False) -> None:
        if not self.pending or (not force and len(self.pending) < BATCH_FILES and self.pending_bytes < BATCH_BYTES):
            return
        batch, self.pending, self.pending_bytes = self.pending, [], 0
        _commit_parts(batch, self.state, self.totals)

    def run(self) -> None:
        while True:
            op, arg = self.q.get()
            try:
                if op == "open":
                    it, offset = arg
                    self.cur = _open_part(it, offset)
                    if self.cur["n"]:
                        self.totals.resumed_files += 1
                        self.totals.resumed_bytes += self.cur["n"]
                    self.progress.advance(self.cur["n"])
                elif op == "data" and self.cur is not None:
                    self.cur["f"].write(arg)
                    self.cur["h"].update(arg)
                    self.cur["n"] += len(arg)
                    self.progress.advance(len(arg))
                elif op == "end" and self.cur is not None:
                    cur, self.cur = self.cur, None
                    if _verify_part(cur, arg, self.totals):
                        self.pending.append(cur)
                        self.pending_bytes += cur["n"]
                        self._commit()
                elif op == "stop":
                    if self.cur is not None:
                        self.cur["f"].close()  # an unfinished .part stays: the next gather resumes it
                        self.cur = None
                    self._commit(force=True)
                    return
            except OSError as exc:
                self.totals.errors.append(f"writing {self.cur['item'].dest if self.cur else '?'}: {exc}")
                if self.cur is not None:
                    self.cur["f"].close()
                    self.cur = None


def fetch(
    conn: Connection, python: str, root: str, items: list[Item], state: GatherState, totals: Totals, progress: Progress
) -> None:
    """Copy `items` from `root` on the node, one exec channel for all of them."""
    todo: list[Item] = []
    for it in items:
        if state.verified(it.dest, it.size, it.mtime_ns):
            totals.skipped_verified += 1
            progress.advance(it.size)
        else:
            todo.append(it)
    if not todo:
        return
    by_rel = {it.rel: it for it in todo}
    requests = []
    for it in todo:
        part = it.dest.with_name(it.dest.name + ".part")
        offset = part.stat().st_size if part.is_file() and not part.is_symlink() else 0
        requests.append({"path": it.rel, "offset": offset if offset <= it.size else 0})
    writer = _PartWriter(state, totals, progress)
    writer.start()
    chan = conn.exec([python, "-m", "worker_entry", "send"])
    try:
        chan.send(wire.command_line({"root": root, "files": requests}))
        decoder = wire.FrameDecoder()
        receiving = False
        done = False
        idle_since = time.monotonic()
        while not done:
            select.select(chan.filenos(), [], [], 5.0)
            out, err, eof = chan.read()
            if out or err:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_TIMEOUT_S:
                totals.errors.append(f"{root}: no data for {IDLE_TIMEOUT_S:g}s; the transfer was abandoned")
                break
            for fr in decoder.feed(out) if out else []:
                if fr.type == wire.T_DATA:
                    if receiving:
                        writer.q.put(("data", fr.payload))
                    continue
                m = fr.json()
                kind = m.get("type")
                if kind == "file":
                    it = by_rel.get(m["path"])
                    receiving = it is not None
                    if it is None:
                        totals.errors.append(f"{root}: node sent an unrequested file {m['path']!r}")
                    else:
                        writer.q.put(("open", (it, int(m.get("offset") or 0))))
                elif kind == "end" and receiving:
                    writer.q.put(("end", m))
                    receiving = False
                elif kind == "error":
                    totals.errors.append(f"{root}/{m.get('path')}: {m.get('error')}")
                elif kind == "done":
                    done = True
            if eof and not done:
                status = chan.exit_status()
                detail = err.decode("utf-8", "replace").strip()[-300:]
                totals.errors.append(f"{root}: transfer ended early (status {status}) {detail}".strip())
                break
    finally:
        writer.q.put(("stop", None))
        writer.join()
        chan.close()


def _open_part(it: Item, offset: int) -> dict[str, Any]:
    part = it.dest.with_name(it.dest.name + ".part")
    h = hashlib.sha256()
    if offset and part.is_file():
        with open(part, "rb") as f:
            left = offset
            while left:
                chunk = f.read(min(1 << 20, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
        f = open(part, "r+b")  # noqa: SIM115
        f.truncate(offset)
        f.seek(offset)
    else:
        offset = 0
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        f = os.fdopen(fd, "wb")
    return {"item": it, "part": part, "f": f, "h": h, "n": offset}


def _verify_part(cur: dict[str, Any], end: dict[str, Any], totals: Totals) -> bool:
    """Close a received ``.part`` and check it against the node's size and sha256 (removed if bad)."""
    cur["f"].close()
    it: Item = cur["item"]
    cur["sha"] = sha = cur["h"].hexdigest()
    if cur["n"] == end.get("size") and sha == end.get("sha256"):
        return True
    cur["part"].unlink(missing_ok=True)
    totals.errors.append(
        f"{it.rel}: verification failed (got {cur['n']} bytes sha256 {sha[:12]}, node says {end.get('size')} bytes "
        f"sha256 {str(end.get('sha256'))[:12]}); the partial copy was removed, run `tfcluster gather` again"
    )
    return False


def _commit_parts(batch: list[dict[str, Any]], state: GatherState, totals: Totals) -> None:
    """Make verified parts durable, then rename them into place (a crash before the renames leaves
    complete ``.part`` files, which the next gather verifies without copying them again)."""
    try:
        _sync_files([cur["part"] for cur in batch])
        for cur in batch:
            it: Item = cur["item"]
            os.replace(cur["part"], it.dest)
            state.record(it.dest, cur["n"], it.mtime_ns, cur["sha"])
            totals.files += 1
            totals.bytes += cur["n"]
        for d in {cur["item"].dest.parent for cur in batch}:
            _fsync_dir(d)
    except OSError as exc:
        totals.errors.append(f"writing {batch[0]['item'].dest.parent}: {exc}")


def _sync_files(paths: list[Path]) -> None:
    """One ``syncfs`` of the destination filesystem when the platform has it, else fsync each file."""
    if _SYNCFS is not None and paths:
        fd = os.open(paths[0].parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            if _SYNCFS(fd) == 0:
                return
        finally:
            os.close(fd)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _load_syncfs() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).syncfs
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_SYNCFS = _load_syncfs()


def _manifest(conn: Connection, python: str, roots: list[str], clean: list[str]) -> list[dict[str, Any]]:
    payload = {"roots": roots, "exclude_prefixes": [TEMP_PREFIX], "clean": clean}
    code, out, err = conn.run([python, "-m", "worker_entry", "manifest"], wire.command_line(payload), timeout=120)
    if code != 0:
        raise RuntimeError(f"listing files failed (exit {code}): {err.decode('utf-8', 'replace').strip()[-300:]}")
    line = out.strip().splitlines()[-1] if out.strip() else b"{}"
    return json.loads(line)["manifests"]


def _items(manifest: dict[str, Any], dest_base: Path, totals: Totals) -> list[Item]:
    items = []
    for f in manifest.get("files", []):
        try:
            dest = dest_path(dest_base, f["path"])
        except UnsafePath as exc:
            totals.skipped.append({"path": f.get("path"), "reason": str(exc)})
            continue
        items.append(Item(f["path"], dest, int(f["size"]), f.get("mtime_ns")))
    for s in manifest.get("skipped", []):
        totals.skipped.append(s)
    return items


def gather_after_run(
    spec: Any, plan: Plan, conns: dict[str, Connection], rundir: RunDir, bus: EventBus, *, attempts: int
) -> dict[str, Any]:
    """Logs + exit status of every task and attempt; the chief's checkpoints. Returns a summary.

    Hosts are gathered in parallel; a task's node-side log is copied only when it differs in size
    from what arrived live (then the node's copy completes RUN/logs/).
    """
    bus.emit("gather_started", attempts=attempts)
    state = GatherState.load(rundir.path / "gather-state.json")
    totals = Totals()
    reachable = []
    for node in plan.nodes:
        conn = conns.get(str(node.task))
        if conn is None or not conn.is_alive():
            totals.errors.append(f"{node.task} ({node.host}): host not reachable; its node-side logs were not gathered")
        else:
            reachable.append((node, conn))

    def listing(pair: tuple[NodePlan, Connection]) -> tuple[NodePlan, Connection, list[dict[str, Any]] | str]:
        node, conn = pair
        roots = [f"{node.remote_dir}/attempt-{a}" for a in range(attempts)]
        if node.is_chief and spec.checkpoint.gather:
            roots.append(node.checkpoint_dir)
        clean = [] if node.is_chief else [node.checkpoint_dir, node.backup_dir]
        try:
            return node, conn, _manifest(conn, node.argv[0], roots, clean)
        except Exception as exc:
            return node, conn, f"{node.task} ({node.host}): {exc}"

    workers = max(1, min(16, len(reachable)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listed = list(pool.map(listing, reachable))

    ckpt_summary: dict[str, Any] = {"gathered": False}
    logs_summary: dict[str, str] = {}
    work: list[tuple[NodePlan, Connection, list[tuple[str, list[Item]]]]] = []
    for node, conn, manifests in listed:
        if isinstance(manifests, str):
            totals.errors.append(manifests)
            continue
        jobs: list[tuple[str, list[Item]]] = []
        for a in range(attempts):
            m = manifests[a]
            key = f"{node.task}" + (f" attempt {a}" if a else "")
            if not m.get("exists"):
                logs_summary[key] = "no node-side directory"
                continue
            dest = rundir.gather_dir / node.task.slug / f"attempt-{a}"
            dest.mkdir(parents=True, exist_ok=True, mode=0o700)
            items = _items(m, dest, totals)
            live = rundir.task_log(node.task.slug, a)
            live_size = live.stat().st_size if live.is_file() else -1
            node_log = next((i for i in items if i.rel == "output.log"), None)
            if node_log is not None and node_log.size == live_size:
                items.remove(node_log)
                logs_summary[key] = f"complete: all {live_size} bytes arrived live"
            elif node_log is not None:
                logs_summary[key] = f"completed from the node: {node_log.size - max(live_size, 0)} bytes missed live"
            jobs.append((m["root"], items))
        if node.is_chief and spec.checkpoint.gather:
            m = manifests[-1]
            ckpt_summary = {
                "gathered": m.get("exists", False),
                "source": f"{node.host}:{m.get('root')}",
                "task": str(node.task),
            }
            if m.get("exists"):
                rundir.checkpoints_dir.mkdir(exist_ok=True, mode=0o700)
                jobs.append((m["root"], _items(m, rundir.checkpoints_dir, totals)))
        work.append((node, conn, jobs))

    progress = Progress(sum(it.size for _, _, jobs in work for _, items in jobs for it in items))

    def copy(entry: tuple[NodePlan, Connection, list[tuple[str, list[Item]]]]) -> Totals:
        node, conn, jobs = entry
        mine = Totals()
        for root, items in jobs:
            fetch(conn, node.argv[0], root, items, state, mine, progress)
        return mine

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(work)))) as pool:
            for t in pool.map(copy, work):
                totals.merge(t)
    finally:
        progress.close()
        state.save()
    for node, _, _ in work:
        for a in range(attempts):
            _complete_live_log(rundir, node, a, rundir.gather_dir / node.task.slug / f"attempt-{a}", bus)
    summary = {
        "files": totals.files,
        "bytes": totals.bytes,
        "already_verified": totals.skipped_verified,
        "resumed_files": totals.resumed_files,
        "resumed_bytes": totals.resumed_bytes,
        "skipped": totals.skipped,
        "errors": totals.errors,
        "logs": logs_summary,
        "checkpoints": ckpt_summary,
        "dest": str(rundir.path),
    }
    if totals.errors:
        bus.emit("gather_failed", message="; ".join(totals.errors[:3]), errors=totals.errors)
    bus.emit(
        "gather_finished",
        files=totals.files,
        bytes=totals.bytes,
        dest=str(rundir.path),
        already_verified=totals.skipped_verified,
        skipped=len(totals.skipped),
        errors=len(totals.errors),
    )
    return summary


def _complete_live_log(rundir: RunDir, node: NodePlan, attempt: int, dest: Path, bus: EventBus) -> None:
    """If lines never arrived live (a broken channel), the node's copy completes RUN/logs/."""
    node_log = dest / "output.log"
    live = rundir.task_log(node.task.slug, attempt)
    if not node_log.is_file():
        return
    live_size = live.stat().st_size if live.is_file() else 0
    node_size = node_log.stat().st_size
    if node_size > live_size:
        tmp = live.with_name(live.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        with open(node_log, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, live)
        bus.emit(
            "warning",
            task=str(node.task),
            host=node.host,
            message=f"{node_size - live_size} bytes of {node.task}'s output never arrived live; "
            f"{live} was completed from the node's copy",
        )
