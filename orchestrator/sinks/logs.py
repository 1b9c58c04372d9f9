"""Every output line of every task: raw per-task file, prefixed combined.log, and the console."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import IO, Any

from ..backends.limits import OPEN_LOGS
from ..core.terminal import redraw, redraw_lines, safe_bytes
from ..runs import RunDir, logline, write_json_atomic
from .collapse import ConsoleLines
from .guard import GuardedFile, WriteGuard
from .style import PALETTE, use_color


class LogRouter:
    """Every line of every task: raw per-task file, prefixed combined.log, and the console.

    Frames carry whole lines, so prefixing is one bytes.replace per frame, not a loop per line. The
    files get the bytes as printed but for ``\\r``/``\\b`` (each line as a terminal leaves it: the final
    text of a progress bar, ``core.terminal.redraw_lines``); the console gets them through
    ``core.terminal.safe_bytes`` (a task's escape sequences must not drive the user's terminal).

    A progress frame (text ending in ``\\r``, no newline: a task's unfinished line being redrawn) is
    logged nowhere: the live display shows it in place (``progress_hook``), and the line, once
    complete, is logged. One the task never completed (it died mid-bar) is logged when the attempt ends.
    """

    def __init__(
        self,
        rundir: RunDir,
        *,
        echo: bool = True,
        out: IO[bytes] | None = None,
        color: bool | None = None,
        guard: WriteGuard | None = None,
        all_output: bool = False,
        clock: Any = time.monotonic,
        open_logs: int = OPEN_LOGS,
    ):
        self.rundir = rundir
        self.guard = guard or WriteGuard()
        self.echo = echo
        self.out = out or sys.stdout.buffer
        self.color = use_color(sys.stdout) if color is None else color
        self.combined = GuardedFile(rundir.combined_log, "ab", self.guard)
        self.files: dict[str, GuardedFile] = {}  # this attempt's open files, by task, least recently written first
        self.paths: dict[str, Path] = {}  # this attempt's files, by task, opened at their first line
        self.made: set[str] = set()  # the tasks whose file of this attempt is made
        self.failed: set[str] = set()  # the tasks whose file of this attempt could not be made or written
        # at most this many tasks' files open at once, the least recently written closed past it (its next
        # line opens it again, appending): a descriptor per task on top of its channel took a 16,384-task
        # launcher past a 20,000 open-file limit ("Too many open files": lines lost from the per-task files)
        self.open_logs = open_logs  # ``backends.limits.open_files``: every task's where the limit has room
        self.prefix: dict[str, bytes] = {}
        self.console_prefix: dict[str, bytes] = {}
        self.lines_written: dict[str, int] = {}
        self.console_hook: Any = None  # set by the live display to print above its table
        self.progress_hook: Any = None  # set by the live display: (task, prefixed text or None)
        self.pending: dict[str, bytes] = {}  # task -> its unfinished line's current text (progress frames)
        self.max_bytes: int | None = None  # logs.max_bytes_per_task (``limit``)
        self.kept: dict[str, int] = {}  # task -> bytes of its lines kept so far, over the run
        self.cuts: dict[str, int] = {}  # task -> the attempt its output was cut in
        self.on_cut: Any = None  # (task, host, limit, attempt): the run's event
        self.hosts: dict[str, str] = {}
        self.attempt = 0
        self._dirty = False
        self._unflushed: set[GuardedFile] = set()
        self._closed = False
        # the console's view: what every task says once, TF's known chatter hidden (``--all-output``: all)
        self.all_output = all_output
        self.console = ConsoleLines(self._echo, collapse=not all_output, show_noise=all_output, clock=clock)

    def open_attempt(self, attempt: int, tasks: list[tuple[str, str, str]]) -> None:
        """tasks: (task, slug, host). Opens this attempt's per-task files."""
        self._settle()
        self.console.close()  # the last attempt's lines before this one's
        self.console.collapse = not self.all_output and len(tasks) > 1  # one task: nothing to wait for
        self._close_files()
        self.attempt = attempt
        for i, (task, slug, host) in enumerate(tasks):
            self.hosts[task] = host
            self.paths[task] = self.rundir.task_log(slug, attempt)
            tag = logline.tag(task, host)
            self.prefix[task] = tag.encode()
            color = PALETTE[i % len(PALETTE)]
            self.console_prefix[task] = (f"\x1b[{color}m{tag}\x1b[0m" if self.color else tag).encode()
            self.lines_written.setdefault(task, 0)
        if attempt:
            self.note(f"=== attempt {attempt} ===")

    def write(self, task: str, data: bytes, ts: float | None = None) -> None:
        """`data` is one or more complete lines (ending in a newline), or a progress frame (``\\r``-ended)."""
        cut = data.rfind(b"\n") + 1
        if cut:
            self._lines(task, data[:cut], ts)
        if cut < len(data):  # a progress frame (or an unfinished line from elsewhere): shown in place only
            self._progress(task, data[cut:])

    def limit(self, max_bytes: int | None, on_cut: Any = None) -> None:
        """Keep at most ``max_bytes`` of each task's lines over the run (None: all); ``on_cut`` is told
        once per task when its output is cut."""
        self.max_bytes, self.on_cut = max_bytes, on_cut

    def _room(self, task: str, data: bytes) -> bytes | None:
        """What of ``data`` (whole lines) fits under the task's cap; None when all of it does. Past the
        cap the cut is written once, and recorded; from then on nothing of the task is kept."""
        if task in self.cuts:
            return b""
        kept = self.kept.get(task, 0)
        if self.max_bytes is None or kept + len(data) <= self.max_bytes:
            self.kept[task] = kept + len(data)
            return None
        part = data[: max(0, self.max_bytes - kept)]
        part = part[: part.rfind(b"\n") + 1]  # the lines that fit, whole
        self.kept[task] = kept + len(part)
        self.cuts[task] = self.attempt
        if part:
            self._lines(task, part, None, counted=True)
        text = (
            f"tfcluster: {task}'s output is cut here: it passed logs.max_bytes_per_task ({self.max_bytes} bytes); "
            "the launcher keeps no more of it, its node keeps its own complete log\n"
        ).encode()
        self._lines(task, text, None, counted=True)
        with contextlib.suppress(OSError):
            write_json_atomic(self.rundir.log_cuts, self.cuts, durable=False)
        if self.on_cut is not None:
            self.on_cut(task, self.hosts.get(task), self.max_bytes, self.attempt)
        return b""

    def _lines(self, task: str, data: bytes, ts: float | None, counted: bool = False) -> None:
        if self.pending.pop(task, None) is not None and self.progress_hook is not None:
            self.progress_hook(task, None)  # its line is complete: printed below like any other
        data = redraw_lines(data)
        if not counted and self._room(task, data) is not None:
            return  # what fitted is written; a flood past the cap costs the launcher neither disk nor memory
        f = self._file(task)
        if f is not None:
            f.write(data)
            self._unflushed.add(f)
        self.lines_written[task] = self.lines_written.get(task, 0) + data.count(b"\n")
        body = data[:-1] if data.endswith(b"\n") else data
        tag = logline.stamp(ts or time.time()) + self.prefix.get(task, f"[{task}] ".encode())
        self.combined.write(tag + body.replace(b"\n", b"\n" + tag) + b"\n")
        if self.echo:  # the file keeps the bytes as printed; the terminal gets them made safe
            ctag = self.console_prefix.get(task, tag)
            self.console.add(task, ctag, safe_bytes(body, keep_sgr=self.color).split(b"\n"))
        self._dirty = True

    def _echo(self, text: bytes) -> None:
        """One or more console lines: above the live table when it shows, else on stdout."""
        if not self.echo:
            return
        if self.console_hook is not None:
            self.console_hook(text)
        else:
            try:
                self.out.write(text)
            except (OSError, ValueError):
                self.echo = False
        self._dirty = True

    def _progress(self, task: str, data: bytes) -> None:
        text = redraw(data.decode("utf-8", "replace")).encode()
        if not text:
            return
        self.pending[task] = text
        if self.echo and self.progress_hook is not None:
            ctag = self.console_prefix.get(task, f"[{task}] ".encode())
            self.progress_hook(task, ctag + safe_bytes(text, keep_sgr=self.color))

    def _settle(self) -> None:
        """Log the unfinished lines of tasks that never completed them (the last text they showed)."""
        pending, self.pending = self.pending, {}
        for task, text in pending.items():
            self.write(task, text + b"\n")

    def note(self, text: str) -> None:
        """A launcher line in combined.log (attempt boundaries)."""
        self.combined.write(logline.note_line(time.time(), text))
        self._dirty = True

    def flush(self) -> None:
        self.console.flush()  # the lines held for their window (``ConsoleLines``)
        if not self._dirty:
            return
        for f in self._unflushed:  # only the files written since (a thousand tasks, a few lines each)
            f.flush()
        self._unflushed.clear()
        self.combined.flush()
        if self.echo and self.console_hook is None:
            try:
                self.out.flush()
            except (OSError, ValueError):
                self.echo = False
        self._dirty = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._settle()
        self.console.close()
        self.flush()
        self._close_files()
        self.combined.close()

    def _file(self, task: str) -> GuardedFile | None:
        """The task's file of this attempt, created at its first line: not 4,096 files created before the
        first task can say hello (1.7 s of the start on a slow directory, ``bench/start_phases.py``).
        Past ``open_logs`` open files the least recently written one is flushed and closed first."""
        f = self.files.get(task)
        if f is not None:
            if len(self.files) >= self.open_logs:  # full: the least recently written closes first
                self.files[task] = self.files.pop(task)
            return f
        if task not in self.failed and (path := self.paths.get(task)) is not None:
            while len(self.files) >= self.open_logs:
                self._close(next(iter(self.files)))
            f = self.files[task] = GuardedFile(path, "ab", self.guard)
            self.made.add(task)
        return f

    def _close(self, task: str) -> None:
        """Its file flushed and closed; one that could not be made or written is not tried again this
        attempt (one warning, as while it stayed open)."""
        f = self.files.pop(task)
        self._unflushed.discard(f)
        if not f.ok:
            self.failed.add(task)
        f.close()  # (a buffered file flushes as it closes)

    def _close_files(self) -> None:
        """This attempt's files closed; a task that printed nothing gets its empty file all the same
        (the gather and the hand-over compare the node's log with it)."""
        for task in list(self.files):
            self._close(task)
        for task in self.paths:
            if task not in self.made:
                f = self._file(task)
                if f is not None:
                    self._close(task)
        self.paths = {}
        self.made = set()
        self.failed = set()
