"""`tfcluster logs`: read (and follow) a run's combined.log, filtered by task, pattern and time."""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from ..core.errors import UsageError
from ..core.terminal import safe_text
from ..plan import TaskId
from ..runs import RunDir
from ..runs.logline import parse_line
from ..runs.tail import Tail
from ..sinks import PALETTE, use_color
from ..sinks.noise import is_noise
from .handle import RunHandle

DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
POLL_S = 0.2


def parse_duration(text: str, option: str = "--since") -> float:
    m = DURATION_RE.match(text.strip())
    if not m:
        raise UsageError(f"{option} {text!r}: expected a duration like 30s, 5m, 2h or 1d")
    return float(m.group(1)) * UNITS[m.group(2)]


@dataclass(frozen=True)
class LogQuery:
    tasks: frozenset[str] = frozenset()
    pattern: re.Pattern | None = None
    since_ts: float | None = None
    raw: bool = False
    timestamps: bool = False
    hide_tf_noise: bool = False  # TensorFlow's known chatter left out (``sinks.noise``; the logs keep it)

    @classmethod
    def from_args(
        cls,
        *,
        tasks: list[str] | None,
        grep: str | None,
        since: str | None,
        raw: bool,
        timestamps: bool = False,
        hide_tf_noise: bool = False,
    ) -> LogQuery:
        norm = set()
        for t in tasks or []:
            try:
                norm.add(str(TaskId.parse(t)))
            except ValueError as exc:
                raise UsageError(f"--task {t!r}: {exc}") from None
        try:
            pattern = re.compile(grep) if grep else None
        except re.error as exc:
            raise UsageError(f"--grep {grep!r}: not a valid regular expression: {exc}") from None
        since_ts = time.time() - parse_duration(since) if since else None
        return cls(frozenset(norm), pattern, since_ts, raw, timestamps, hide_tf_noise)

    def render(self, line: str, color: bool) -> str | None:
        """The line as shown, or None when filtered out."""
        parts = self.parts(line, color)
        return None if parts is None else parts[1] + parts[2]

    def parts(self, line: str, color: bool) -> tuple[str | None, str, str] | None:
        """The line as shown, in parts: its task (None for a launcher note or a foreign line), its prefix
        and its body; None when filtered out. The Slurm follower collapses by task what every rank said
        (``sinks.collapse``), so it needs the task apart from the text."""
        parsed = parse_line(line)
        if parsed is None:
            return (None, "", safe_text(line)) if not (self.tasks or self.pattern) else None
        if self.tasks and not parsed.is_note and parsed.task not in self.tasks:
            return None
        if self.pattern and not self.pattern.search(parsed.body):
            return None
        if self.hide_tf_noise and not parsed.is_note and is_noise(parsed.body.encode("utf-8", "replace")):
            return None
        if self.since_ts is not None:
            ts = parsed.ts
            if ts is not None and ts < self.since_ts:
                return None
        body = safe_text(parsed.body, keep_sgr=color)  # combined.log has the bytes as printed; not the terminal
        task = None if parsed.is_note else parsed.task
        if self.raw:
            return task, "", body
        prefix = f"[{safe_text(parsed.tag)}]"
        if color and not parsed.is_note:
            idx = _task_color_index(parsed.task)
            prefix = f"\x1b[{PALETTE[idx % len(PALETTE)]}m{prefix}\x1b[0m"
        prefix += " "
        return task, (f"{parsed.ts_text} {prefix}" if self.timestamps else prefix), body


def _task_color_index(task: str) -> int:
    kind, _, idx = task.partition(":")
    base = 0 if kind == "chief" else 1
    return base + (int(idx) if idx.isdigit() else 0)


def show_logs(
    run: RunDir, query: LogQuery, *, follow: bool, out: IO[str] | None = None, alive: Callable[[], bool] | None = None
) -> None:
    """Print the run's lines; ``follow``: until the run ends (result.json) or its supervisor is gone
    (``alive``: the run's handle says so; default: its launcher process)."""
    out = out or sys.stdout
    alive = alive or RunHandle(run).alive
    color = use_color(out)
    tail = Tail(run.combined_log)
    if os.path.lexists(run.combined_log) and not stat.S_ISREG(os.lstat(run.combined_log).st_mode):
        # (a link or a FIFO planted there is never read: said, rather than showing an empty log)
        print(f"tfcluster: {run.combined_log}: not a regular file (a link or a FIFO?); not read", file=sys.stderr)

    def show(raw: bytes) -> None:
        shown = query.render(raw.decode("utf-8", "replace"), color)
        if shown is not None:
            out.write(shown + "\n")

    while True:
        finished_before_read = run.is_finished()
        got = False
        for raw in tail.lines():
            got = True
            show(raw)
        out.flush()
        if not follow:
            break
        if finished_before_read and not got:
            break  # the launcher wrote result.json before our last read: nothing more will come
        if not got and not alive() and not run.is_finished():
            print("tfcluster: the launcher of this run is gone (no result.json); stopped following", file=sys.stderr)
            break
        time.sleep(POLL_S)
    rest = tail.rest()
    if rest:
        show(rest)
        out.flush()
