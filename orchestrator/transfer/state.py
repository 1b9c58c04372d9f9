"""What a transfer remembers: verified files (for resuming), the items to copy, totals, a progress bar."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runs import write_json_atomic


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
        # Not fsynced: every file it lists was synced before it was recorded, and a state lost to a
        # crash is only an older one (those files are copied again), never a wrong one.
        write_json_atomic(self.path, {"files": snapshot}, indent=None, durable=False)


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
    interrupted: bool = False

    def merge(self, other: Totals) -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.skipped_verified += other.skipped_verified
        self.resumed_files += other.resumed_files
        self.resumed_bytes += other.resumed_bytes
        self.errors += other.errors
        self.skipped += other.skipped
        self.interrupted = self.interrupted or other.interrupted


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


KEEP_FREE = 1 << 20  # what a transfer always leaves free on the launcher's disk
CHECK_EVERY = 64 << 20  # a running transfer looks at the free space again after this many bytes


def free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class NoSpace(OSError):
    """Writing on would leave less than ``KEEP_FREE`` on the launcher's disk."""


class SpaceGuard:
    """What a node sends is written only while the disk keeps ``KEEP_FREE`` free — whatever the node
    declared and whoever else fills the disk meanwhile (free space is looked at again every
    ``CHECK_EVERY`` bytes, so a statvfs is not a cost per write)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._budget = 0

    def take(self, n: int) -> None:
        if n <= self._budget:
            self._budget -= n
            return
        free = free_bytes(self.path)
        if free is None:  # cannot tell: the write itself will say
            self._budget = CHECK_EVERY
        else:
            self._budget = max(0, min(free - KEEP_FREE, CHECK_EVERY))
        if n > self._budget:
            raise NoSpace(
                f"not enough space in {self.path}: {(free or 0) / 1e6:.1f} MB free, {KEEP_FREE / 1e6:.0f} MB stays free; "
                "free some space, then run `tfcluster gather RUN`"
            )
        self._budget -= n


def check_space(dest: Path, items: list[Item], totals: Totals) -> bool:
    """Refuse to start copying what cannot fit: a gather that fills the disk helps nobody (and
    would also stop the run directory's own files). A margin stays free; ``SpaceGuard`` holds the
    copy to it while it runs."""
    need = sum(it.size for it in items)
    if not need:
        return True
    free = free_bytes(dest)
    if free is None:
        return True
    if need + need // 100 + KEEP_FREE <= free:
        return True
    totals.errors.append(
        f"not enough space in {dest}: {need / 1e6:.1f} MB to copy, {free / 1e6:.1f} MB free; "
        "free some space, then run `tfcluster gather RUN`"
    )
    return False
