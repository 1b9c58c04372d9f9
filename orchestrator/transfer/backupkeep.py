"""While an attempt runs, copy each new save of the chief's backup off its host, in the background.

A thread of the launcher (never the training process, which only ever writes its backup) looks at the
chief's ``BACKUP_DIR/chief`` every ``interval_s`` — one listing on that host, a short ``worker_entry
manifest`` — and copies a new save into the run directory's ``CopyStore``. Training never waits on
it: a slow copy only makes the next one later. The events it has to tell (``backup_copied``) wait in a
queue for the job's own thread (the bus and its sinks belong to one thread), which takes them at the
attempt's end (``drain``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..backends import Connection
from ..events.kinds import BackupCopied
from ..plan import Plan
from .backupcopy import Copy, CopyStore, TornCopy
from .fetch import StopCheck

#: A listing on a host that is gone gives up after this long (a copy under way stops with the attempt).
PASS_TIMEOUT_S = 15.0
#: The last look at the chief before the next attempt: short, the host may be the one that is gone.
CATCH_UP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Watched:
    """The chief whose backup is copied: the task, its host, its python and its backup directory."""

    task: str
    host: str
    python: str
    root: str
    attempt: int

    @classmethod
    def of(cls, plan: Plan, attempt: int) -> Watched:
        c = plan.chief
        return cls(str(c.task), c.host, c.argv[0], f"{c.backup_dir}/chief", attempt)


class BackupKeeper:
    def __init__(self, store: CopyStore, connection: Callable[[str], Connection | None], interval_s: float) -> None:
        self.store = store
        self.connection = connection
        self.interval_s = interval_s
        self.watched: Watched | None = None
        self.problem: str | None = None  # the last pass's trouble (a torn copy, a host out of reach)
        self.torn = False  # the last pass met a save under way
        self.copies = 0  # copies made for the watched attempt
        self._lock = threading.Lock()  # one pass at a time: the thread's or the job's catch-up
        self._events: list[BackupCopied] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, plan: Plan, attempt: int) -> None:
        """Watch ``plan``'s chief for this attempt (no thread when copies are off)."""
        self.watched = Watched.of(plan, attempt)
        self.copies = 0
        if self.interval_s <= 0:
            return
        self._stop = threading.Event()  # its own: a pass of the last attempt still ending keeps the old one
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="backup-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The attempt ended: no new pass starts, a copy under way is abandoned (within a second; a
        listing within ``PASS_TIMEOUT_S``). Not waited for: the attempt's end is not held up by a host
        that is gone (the next ``copy_once`` waits for that pass)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    def _loop(self, stopped: threading.Event) -> None:
        wait = self.interval_s
        while not stopped.wait(wait):
            self.copy_once(stop=lambda: 2 if stopped.is_set() else 0)
            # a torn copy (the chief saved meanwhile) is tried again soon: the save it met is complete now
            wait = min(self.interval_s, 0.5) if self.torn else self.interval_s

    def copy_once(self, timeout: float = PASS_TIMEOUT_S, stop: StopCheck | None = None) -> Copy | None:
        """One pass: a new save of the watched chief copied, or None (nothing new, or it could not be)."""
        w = self.watched
        if w is None:
            return None
        with self._lock:
            self.torn = False
            try:
                conn = self.connection(w.task)
                if conn is None:
                    self.problem = f"{w.host} cannot be reached for helper commands"
                    return None
                info = {"task": w.task, "host": w.host, "attempt": w.attempt}
                c = self.store.take(conn, w.python, w.root, info, timeout, stop)
            except TornCopy as exc:
                self.problem, self.torn = str(exc), True
                return None
            except Exception as exc:  # a host that is gone, a listing refused: the copies so far stay
                self.problem = f"{w.host}: {exc}"
                return None
            if c is not None:
                self.problem = None
                self.copies += 1
                self._events.append(
                    BackupCopied(
                        task=w.task,
                        host=w.host,
                        attempt=w.attempt,
                        copy=str(c.root),
                        files=len(c.files),
                        bytes=int(c.info.get("bytes", 0)),
                        fetched=int(c.info.get("fetched", 0)),
                        save_s=float(c.info.get("save_s", 0.0)),
                        copy_s=float(c.info.get("copy_s", 0.0)),
                    )
                )
            return c

    def drain(self) -> list[BackupCopied]:
        """The events of the copies made since the last drain, in order (for the job's thread to emit)."""
        with self._lock:
            out, self._events = self._events, []
        return out
