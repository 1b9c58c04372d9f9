"""The chief's backup, kept off its host: complete, verified copies in the launcher's run directory.

Under MWMS only the chief writes the real ``BackupAndRestore`` backup (``BACKUP_DIR/chief``). On local
disks, losing the chief's host loses it, and the next attempt would start at epoch 0. So the launcher
(never the training process) copies each new save off that host into ``RUN/backup/``:

- **incremental**: a file whose path, size and mtime match the previous copy is hard-linked from it
  (a regular file only: nothing there is followed), only the others cross the network;
- **verified**: every fetched file is hashed as it is written and must match the sha256 the node sent
  (``fetch``); the manifest records each file's sha256, and ``verify_copy`` checks them all again before
  a copy seeds anything;
- **atomic**: a copy is assembled in ``.incoming-N/`` and renamed to ``copy-N/`` only once whole (files
  synced, manifest written last); a reader only ever looks at ``copy-N`` names, so a copy cut short
  (a crash, a lost host, a save that changed the files while they were copied) is never used;
- **consistent**: the chief's directory is listed again after the copy: a save that happened meanwhile
  makes the copy torn, and it is dropped (the next pass copies the newer save).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker_entry import protocol as p

from ..backends import Connection
from .fetch import StopCheck, fetch, items_of, list_files
from .state import GatherState, Item, Progress, Totals, check_space

MANIFEST = "manifest.json"
FILES = "files"  # the backup's own files, under copy-N/files/ (a backup file may be called manifest.json)
KEEP = 2  # complete copies kept: the newest and one before it, should the newest fail verification
COPY_RE = re.compile(r"^copy-(\d{6,})$")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class CopiedFile:
    path: str
    size: int
    mtime_ns: int | None
    sha256: str


@dataclass(frozen=True)
class Copy:
    """One complete copy: ``root`` is ``copy-N``; its files are under ``root/files``."""

    root: Path
    seq: int
    files: tuple[CopiedFile, ...]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def signature(self) -> list[tuple[str, int, int | None]]:
        return sorted((f.path, f.size, f.mtime_ns) for f in self.files)

    def items(self) -> list[Item]:
        """The copy's files as transfer items (what ``push_dir`` streams to a node)."""
        return [Item(f.path, self.root / FILES / f.path, f.size, f.mtime_ns) for f in self.files]


def signature(manifest: p.Manifest) -> list[tuple[str, int, int | None]]:
    return sorted((f.path, f.size, f.mtime_ns) for f in manifest.files)


class TornCopy(RuntimeError):
    """The copy could not be made whole; nothing of it is used."""


class CopyStore:
    """``RUN/backup/``: complete copies ``copy-N``, at most one ``.incoming-N`` being assembled."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def copies(self) -> list[Copy]:
        """Every complete copy, newest first (a ``copy-N`` whose manifest is unreadable is skipped)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = COPY_RE.match(name)
            if m is None or not stat.S_ISDIR(os.lstat(self.root / name).st_mode):
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                out.append(_read_copy(self.root / name, int(m.group(1))))
        return sorted(out, key=lambda c: c.seq, reverse=True)

    def newest(self, verify: bool = False) -> Copy | None:
        """The newest complete copy (``verify``: the newest whose every file still matches its sha256)."""
        for c in self.copies():
            if not verify or not verify_copy(c):
                return c
        return None

    def _next_seq(self) -> int:
        seqs = [c.seq for c in self.copies()]
        with contextlib.suppress(FileNotFoundError):
            seqs += [int(n.split("-")[1]) for n in os.listdir(self.root) if re.match(r"^\.incoming-\d+$", n)]
        return max(seqs, default=0) + 1

    def take(
        self,
        conn: Connection,
        python: str,
        root: str,
        info: dict[str, Any],
        timeout: float = 60.0,
        stop: StopCheck | None = None,
    ) -> Copy | None:
        """Copy the node's ``root`` if it holds a save the newest copy does not; the new copy, or None
        when there was nothing new. Raises ``TornCopy`` (nothing kept) when it could not be made whole.
        ``timeout`` bounds each listing; ``stop`` (2: abort) ends the copy within a second."""
        t0 = time.monotonic()
        listed = list_files(conn, python, [root], [], timeout=timeout)[0]
        if not listed.exists or not listed.files:
            return None
        prev = self.newest()
        if prev is not None and prev.signature == signature(listed):
            return None
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        seq = self._next_seq()
        incoming = self.root / f".incoming-{seq}"
        if incoming.is_symlink():  # planted: removed, never written through
            incoming.unlink()
        shutil.rmtree(incoming, ignore_errors=True)
        incoming.mkdir(mode=0o700)
        (incoming / FILES).mkdir(mode=0o700)
        try:
            totals = Totals()
            items = items_of(listed, incoming / FILES, totals)
            if len(items) != len(listed.files):  # a path that would leave the copy (symlinks: never listed)
                raise TornCopy(f"unsafe entries in {root}: {totals.skipped[:3]}")
            state = GatherState(incoming / ".state")
            linked = _link_unchanged(prev, items, state)
            if not check_space(self.root, [it for it in items if str(it.dest) not in state.files], totals):
                raise TornCopy("; ".join(totals.errors[:3]))
            # Every file exactly as listed (same size and mtime when sent, gone is an error): the copy is the
            # listing's snapshot, whatever the chief saves meanwhile (it writes new files, then renames its
            # ``checkpoint`` state over the old one, then deletes the old files: each of those is seen).
            # Newest first: the file a save replaces last (the state naming the checkpoint) is sent before a
            # save under way can replace it; the files it names are written once and only deleted later.
            newest_first = sorted(items, key=lambda it: -(it.mtime_ns or 0))
            fetch(
                conn, python, listed.root, newest_first, state, totals, Progress(0, enabled=False), stop, as_listed=True
            )
            if totals.errors or any(str(it.dest) not in state.files for it in items):
                why = "; ".join(totals.errors[:3]) or "not every file was copied"
                raise TornCopy(f"{root} changed while it was copied (a newer save?): {why}")
            files = [CopiedFile(it.rel, it.size, it.mtime_ns, state.files[str(it.dest)]["sha256"]) for it in items]
            mtimes = [f.mtime_ns for f in files if f.mtime_ns is not None]
            changed = [it.mtime_ns for it in items if it.mtime_ns is not None and it.rel not in linked]
            record = {
                **info,
                "seq": seq,
                "root": root,
                "taken_ts": time.time(),
                "newest_mtime_ns": max(mtimes, default=None),
                # How long the chief took writing this save: from its first to its last changed file (a floor).
                "save_s": round((max(changed) - min(changed)) / 1e9, 3) if changed else 0.0,
                "copy_s": round(time.monotonic() - t0, 3),
                "bytes": sum(f.size for f in files),
                "fetched": len(files) - len(linked),
                "linked": len(linked),
                "files": [f.__dict__ for f in files],
            }
            return self._commit(incoming, seq, record)
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            raise

    def _commit(self, incoming: Path, seq: int, record: dict[str, Any]) -> Copy:
        """Manifest last, everything synced, then one rename: ``copy-N`` exists only whole."""
        (incoming / ".state").unlink(missing_ok=True)
        data = (json.dumps(record, indent=None) + "\n").encode()
        fd = os.open(incoming / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for d in {incoming, *(Path(dp) for dp, _, _ in os.walk(incoming))}:
            _fsync_dir(d)
        final = self.root / f"copy-{seq:06d}"
        os.rename(incoming, final)
        _fsync_dir(self.root)
        self._prune()
        return _read_copy(final, seq)

    def _prune(self) -> None:
        for old in self.copies()[KEEP:]:
            shutil.rmtree(old.root, ignore_errors=True)


def _read_copy(root: Path, seq: int) -> Copy:
    fd = os.open(root / MANIFEST, os.O_RDONLY | NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = json.loads(f.read(64 << 20))
    files = tuple(
        CopiedFile(
            str(e["path"]), int(e["size"]), None if e["mtime_ns"] is None else int(e["mtime_ns"]), str(e["sha256"])
        )
        for e in data["files"]
    )
    return Copy(root, seq, files, {k: v for k, v in data.items() if k != "files"})


def _link_unchanged(prev: Copy | None, items: list[Item], state: GatherState) -> set[str]:
    """Hard-link from ``prev`` every file whose path, size and mtime did not change; each is recorded
    verified with the sha256 ``prev`` holds for it. Only a regular file of the right size is linked: a
    link planted in the run directory is never followed (that file is fetched again instead)."""
    if prev is None:
        return set()
    by_path = {f.path: f for f in prev.files}
    linked = set()
    for it in items:
        old = by_path.get(it.rel)
        if old is None or old.size != it.size or old.mtime_ns != it.mtime_ns:
            continue
        src = prev.root / FILES / old.path
        try:
            st = os.lstat(src)
            if not stat.S_ISREG(st.st_mode) or st.st_size != old.size or _has_link_above(prev.root / FILES, src):
                continue
            os.link(src, it.dest, follow_symlinks=False)
        except OSError:
            continue
        state.record(it.dest, it.size, it.mtime_ns, old.sha256)
        linked.add(it.rel)
    return linked


def _has_link_above(base: Path, path: Path) -> bool:
    """A symlinked directory between ``base`` and ``path``."""
    cur = path.parent
    while cur != base and base in cur.parents:
        if cur.is_symlink():
            return True
        cur = cur.parent
    return False


def verify_copy(c: Copy) -> list[str]:
    """Every file of the copy read without following a link and checked against its sha256; the problems."""
    problems = []
    base = c.root / FILES
    for f in c.files:
        path = base / f.path
        try:
            if _has_link_above(base, path):
                raise OSError(f"a symlinked directory on the path of {f.path}")
            fd = os.open(path, os.O_RDONLY | NOFOLLOW)
            h = hashlib.sha256()
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise OSError(f"{f.path} is not a regular file")
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
            if h.hexdigest() != f.sha256:
                problems.append(f"{f.path}: sha256 {h.hexdigest()[:12]}, the copy recorded {f.sha256[:12]}")
        except OSError as exc:
            problems.append(f"{f.path}: {exc}")
    return problems


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
