"""Copy files from a node, verified: the node streams each file with the sha256 of the whole file; we
hash what we write into ``NAME.part`` and rename only when size and sha256 match. A ``.part`` file
resumes where it stopped. Verified files are made durable in batches (one ``syncfs``)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker_entry import protocol as p

from ..backends import Connection, wait_readable
from .paths import UnsafePath, dest_path
from .state import GatherState, Item, NoSpace, Progress, SpaceGuard, Totals

TEMP_PREFIX = "workertemp_"
IDLE_TIMEOUT_S = 60.0

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
        self.guard: SpaceGuard | None = None
        self.no_space = False  # the transfer must stop: the disk keeps its margin

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
                    self.guard = self.guard or SpaceGuard(it.dest.parent)
                    self.cur = _open_part(it, offset)
                    if self.cur["n"]:
                        self.totals.resumed_files += 1
                        self.totals.resumed_bytes += self.cur["n"]
                    self.progress.advance(self.cur["n"])
                elif op == "data" and self.cur is not None:
                    assert self.guard is not None
                    self.guard.take(len(arg))
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
                self.no_space = self.no_space or isinstance(exc, NoSpace)
                self.totals.errors.append(f"writing {self.cur['item'].dest if self.cur else '?'}: {exc}")
                if self.cur is not None:
                    self.cur["f"].close()
                    self.cur = None


#: Transfer stop request: 0 go on, 1 stop after the current file (resumable), 2 abort now.
StopCheck = Callable[[], int]
#: Where non-transfer frames seen on a task's own channel go (its late output lines).
OnFrame = Callable[[p.Frame], None]


def _todo(items: list[Item], state: GatherState, totals: Totals, progress: Progress) -> list[Item]:
    todo = []
    for it in items:
        if state.verified(it.dest, it.size, it.mtime_ns):
            totals.skipped_verified += 1
            progress.advance(it.size)
        else:
            todo.append(it)
    return todo


def _requests(todo: list[Item]) -> list[dict[str, Any]]:
    """What to ask for: each file from where its ``.part`` left off (a resumed copy)."""
    out = []
    for it in todo:
        part = it.dest.with_name(it.dest.name + ".part")
        offset = part.stat().st_size if part.is_file() and not part.is_symlink() else 0
        out.append({"path": it.rel, "offset": offset if offset <= it.size else 0})
    return out


def fetch(
    conn: Connection,
    python: str,
    root: str,
    items: list[Item],
    state: GatherState,
    totals: Totals,
    progress: Progress,
    stop: StopCheck | None = None,
    *,
    as_listed: bool = False,
) -> None:
    """Copy ``items`` from ``root`` on the node over one new exec channel (``worker_entry send``).
    ``as_listed``: a file whose mtime is no longer the listed one is not copied (a snapshot of a directory
    another process rewrites: the chief's backup)."""
    todo = _todo(items, state, totals, progress)
    if not todo:
        return
    writer = _PartWriter(state, totals, progress)
    writer.start()
    chan = conn.exec([python, "-m", "worker_entry", "send"])
    try:
        requests = _requests(todo)
        chan.send(p.command_line({"root": root, "files": requests}))
        by_rel = {it.rel: it for it in todo}
        asked = {r["path"]: r["offset"] for r in requests}
        receive_files(chan, p.FrameDecoder(), root, by_rel, writer, totals, stop=stop, as_listed=as_listed, asked=asked)
    finally:
        writer.q.put(("stop", None))
        writer.join()
        chan.close()


def fetch_over(
    chan: Any,
    decoder: p.FrameDecoder,
    root: str,
    items: list[Item],
    state: GatherState,
    totals: Totals,
    progress: Progress,
    on_frame: OnFrame | None = None,
    stop: StopCheck | None = None,
) -> bool:
    """Copy ``items`` over a task's own channel, still open after its task ended (``fetch``
    command). False when the channel can no longer be used (closed, or the transfer was cut short)."""
    todo = _todo(items, state, totals, progress)
    if not todo:
        return True
    writer = _PartWriter(state, totals, progress)
    writer.start()
    try:
        asked = {r["path"]: r["offset"] for r in _requests(todo)}
        requests = [p.FileRequest(path, offset) for path, offset in asked.items()]
        chan.send(p.command_line(p.Fetch(root=root, files=requests)))
        by_rel = {it.rel: it for it in todo}
        return receive_files(chan, decoder, root, by_rel, writer, totals, on_frame, stop, asked=asked)
    except OSError as exc:
        totals.errors.append(f"{root}: {exc}")
        return False
    finally:
        writer.q.put(("stop", None))
        writer.join()


def receive_files(
    chan: Any,
    decoder: p.FrameDecoder,
    root: str,
    by_rel: dict[str, Item],
    writer: _PartWriter,
    totals: Totals,
    on_frame: OnFrame | None = None,
    stop: StopCheck | None = None,
    as_listed: bool = False,
    *,
    asked: dict[str, int],
) -> bool:
    """Route a file stream into the writer; every message validated, every byte counted against the
    listing (a file may not grow past what was listed, nor end at another size). Between files a
    stop request ends the transfer (what is verified stays, the rest resumes later); a second one
    aborts at once. True when the stream ended with ``done``."""
    cur: Item | None = None
    got = 0
    idle_since = time.monotonic()
    while True:
        if stop is not None and stop() >= (1 if cur is None else 2):
            totals.errors.append(f"{root}: interrupted; `tfcluster gather RUN` resumes it")
            totals.interrupted = True
            return False
        if writer.no_space:  # said in totals.errors; what is verified stays, the rest resumes later
            return False
        wait_readable(chan.filenos(), 1.0)
        out, err, eof = chan.read()
        if time.monotonic() - idle_since > IDLE_TIMEOUT_S:  # (only the transfer's own frames count: below)
            totals.errors.append(f"{root}: no data for {IDLE_TIMEOUT_S:g}s; the transfer was abandoned")
            return False
        try:
            for fr in decoder.feed(out) if out else []:
                if fr.type in (p.T_DATA, p.T_MSG):  # progress: noise on stderr or log lines never hold a transfer
                    idle_since = time.monotonic()
                if fr.type == p.T_DATA:
                    if cur is not None:
                        got += len(fr.payload)
                        if got > cur.size:
                            raise p.ProtocolError(f"{cur.rel}: more bytes than the {cur.size} listed")
                        writer.q.put(("data", fr.payload))
                    continue
                if fr.type == p.T_LOG and on_frame is not None:
                    on_frame(fr)
                    continue
                if fr.type != p.T_MSG:
                    raise p.ProtocolError(f"unexpected frame type {fr.type} in a transfer")
                m = p.parse(fr.payload, p.TRANSFER_MESSAGES)
                if isinstance(m, p.FileStart):
                    cur = by_rel.get(m.path)
                    got = m.offset
                    if cur is None:
                        totals.errors.append(f"{root}: node sent an unrequested file {m.path!r}")
                    elif m.offset != asked.get(m.path, 0):
                        # it resumes where the launcher asked, or the copy would splice two files
                        totals.errors.append(f"{root}/{m.path}: the node sent from byte {m.offset}, not where asked")
                        cur = None
                    elif m.size != cur.size or m.offset > cur.size:
                        totals.errors.append(
                            f"{root}/{m.path}: {m.size} bytes now, {cur.size} when listed; not copied "
                            "(the file changed: run `tfcluster gather` again)"
                        )
                        cur = None
                    elif as_listed and m.mtime_ns != cur.mtime_ns:
                        totals.errors.append(f"{root}/{m.path}: replaced since it was listed; not copied")
                        cur = None
                    else:
                        writer.q.put(("open", (cur, m.offset)))
                elif isinstance(m, p.FileEnd):
                    if cur is not None:
                        writer.q.put(("end", m))
                    cur = None
                elif isinstance(m, p.FileError):
                    totals.errors.append(f"{root}/{m.path}: {m.error}")
                elif isinstance(m, p.Done):
                    return True
        except p.ProtocolError as exc:
            totals.errors.append(f"{root}: protocol error from the node: {exc}")
            return False
        if eof:
            status = chan.exit_status()
            detail = err.decode("utf-8", "replace").strip()[-300:]
            totals.errors.append(f"{root}: transfer ended early (status {status}) {detail}".strip())
            return False


def _open_part(it: Item, offset: int) -> dict[str, Any]:
    part = it.dest.with_name(it.dest.name + ".part")
    h = hashlib.sha256()
    # never through a link, never waiting on a FIFO planted there; resumed only from a regular file that
    # holds the offset (a link at NAME.part was truncated and rewritten, a FIFO hung the gather)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (0 if offset else os.O_TRUNC)
    fd = os.open(part, flags, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or offset > st.st_size:
        os.close(fd)
        raise OSError(errno.EINVAL, f"{part}: not a regular file holding the {offset} bytes to resume from")
    os.set_blocking(fd, True)
    f = os.fdopen(fd, "r+b")
    left = offset
    while left:
        chunk = f.read(min(1 << 20, left))
        if not chunk:
            break
        h.update(chunk)
        left -= len(chunk)
    f.truncate(offset)
    f.seek(offset)
    return {"item": it, "part": part, "f": f, "h": h, "n": offset}


def _verify_part(cur: dict[str, Any], end: p.FileEnd, totals: Totals) -> bool:
    """Close a received ``.part`` and check it against the node's size and sha256 (removed if bad)."""
    cur["f"].close()
    it: Item = cur["item"]
    cur["sha"] = sha = cur["h"].hexdigest()
    if cur["n"] == end.size == it.size and sha == end.sha256:
        return True
    cur["part"].unlink(missing_ok=True)
    totals.errors.append(
        f"{it.rel}: verification failed (got {cur['n']} bytes sha256 {sha[:12]}, node says {end.size} bytes "
        f"sha256 {end.sha256[:12]}); the partial copy was removed, run `tfcluster gather` again"
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
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
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


def list_files(
    conn: Connection, python: str, roots: list[str], clean: list[str], timeout: float = 120.0
) -> list[p.Manifest]:
    """The node's listing of each root (validated), after removing ``clean``'s temporary copies."""
    payload = {"roots": roots, "exclude_prefixes": [TEMP_PREFIX], "clean": clean}
    code, out, err = conn.run([python, "-m", "worker_entry", "manifest"], p.command_line(payload), timeout=timeout)
    if code != 0:
        raise RuntimeError(f"listing files failed (exit {code}): {err.decode('utf-8', 'replace').strip()[-300:]}")
    line = out.strip().splitlines()[-1] if out.strip() else b"{}"
    manifests = p.ManifestReply.parse_line(line).manifests
    if len(manifests) != len(roots):
        raise p.ProtocolError(f"manifest: {len(manifests)} listings for {len(roots)} directories")
    return manifests


def items_of(manifest: p.Manifest, dest_base: Path, totals: Totals) -> list[Item]:
    """The files of a listing that may be written under ``dest_base``; the others are skipped."""
    items = []
    dests: set[Path] = set()
    for f in manifest.files:
        try:
            dest = dest_path(dest_base, f.path)
        except (UnsafePath, OSError) as exc:  # (a name too long for this disk: one file skipped, not the gather)
            totals.skipped.append({"path": f.path, "reason": str(exc)})
            continue
        if dest in dests or dest.with_name(dest.name + ".part") in dests or _part_of(dest) in dests:
            # two entries on one local file ("./a" and "a"), or one on another's partial copy ("a.part" beside
            # "a"): the second would overwrite a verified copy or pass a cap the first was held to
            totals.skipped.append({"path": f.path, "reason": "names the same local file as another entry"})
            continue
        dests.add(dest)
        items.append(Item(f.path, dest, f.size, f.mtime_ns))
    totals.skipped.extend({"path": s.path, "reason": s.reason} for s in manifest.skipped)
    return items


def _part_of(dest: Path) -> Path | None:
    """The file whose partial copy ``dest`` would be (``a.part``: ``a``), or None."""
    return dest.with_name(dest.name[: -len(".part")]) if dest.name.endswith(".part") else None
