"""The live per-worker table on an interactive terminal (rich). Logs scroll above it.

Up to ``summary.FULL_UP_TO`` tasks one a row; a larger job gets its summary (counts per state, the
slowest and fastest tasks, stragglers, failed or lost, the longest silent), a few lines whatever the
task count, redrawn only when a new snapshot comes (every second up to 4,096 tasks, less often beyond).

The table fits the terminal's width: when its columns do not, the lowest-priority ones are narrowed
or dropped (``FIT_STEPS``), never cut at the right edge. Above it, the unfinished line of each task
that is redrawing a progress bar (Keras ``fit``), with the task's prefix, updated in place at most
``PROGRESS_REFRESH_S`` apart; once the line completes it scrolls above like any other.

Only used when stdout is a terminal; pipes and files get plain prefixed lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..core.terminal import safe_text
from ..plan import Plan
from ..supervise.summary import FULL_UP_TO, summarize, summary_lines

#: The table's columns, in order; the last one holds the flags (straggler, GPU problems).
COLUMNS = ("task", "host", "state", "step", "step ms", "ex/s", "cpu%", "rss MB", "gpu%", "heartbeat", "")
#: What is given up, in order, while the table is wider than the terminal: (column, width to narrow it
#: to, or None to drop it). Task, state and step stay; the flags are narrowed last.
FIT_STEPS: tuple[tuple[str, int | None], ...] = (
    ("host", 16),
    ("", 24),
    ("rss MB", None),
    ("cpu%", None),
    ("gpu%", None),
    ("heartbeat", None),
    ("host", None),
    ("ex/s", None),
    ("", 10),
    ("step ms", None),
)
PROGRESS_REFRESH_S = 0.25  # the in-place progress lines: at most 4 redraws a second
MAX_PROGRESS_LINES = 8  # more tasks redrawing at once: their count, not a line each


def _fmt(value: Any, fmt: str, empty: str = "-") -> str:
    return empty if value is None else format(value, fmt)


class _Screen:
    """The live region: the progress lines, then the table (rendered on each refresh)."""

    def __init__(self, owner: LiveTable) -> None:
        self.owner = owner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        yield from self.owner.progress_lines()
        yield self.owner.body


class LiveTable:
    def __init__(self, plan: Plan, console: Console | None = None) -> None:
        self.plan = plan
        self.console = console or Console(file=sys.stdout)
        self.order = {str(n.task): i for i, n in enumerate(plan.nodes)}
        self.bars: dict[str, Text] = {}  # task -> its unfinished line being redrawn (prefixed)
        self.last_refresh = 0.0
        self.body: Table | Text = self._render({})
        self.screen = _Screen(self)
        self.live = Live(
            self.screen,
            console=self.console,
            refresh_per_second=1,
            auto_refresh=False,  # redrawn on update(): no re-render of an unchanged table 4 times a second
            redirect_stdout=True,
            redirect_stderr=True,
            transient=False,
        )

    @property
    def active(self) -> bool:
        return self.live.is_started

    def start(self) -> None:
        if not self.live.is_started:
            self.live.start()

    def stop(self) -> None:
        if self.live.is_started:
            self.bars.clear()  # a bar left unfinished is in the logs (``LogRouter``); the screen keeps the table
            self.live.stop()

    def print_log(self, data: bytes) -> None:
        if not self.live.is_started:
            sys.stdout.buffer.write(data)
            return
        text = safe_text(data.decode("utf-8", "replace"), keep_sgr=True)  # already made safe: once more is free
        self.console.print(Text.from_ansi(text.rstrip("\n")), soft_wrap=True, highlight=False, markup=False)

    def progress(self, task: str, line: bytes | None) -> None:
        """A task's unfinished line (prefixed, made safe) to show in place; None: it completed."""
        if line is None:
            if self.bars.pop(task, None) is None:
                return
        else:
            self.bars[task] = Text.from_ansi(line.decode("utf-8", "replace"), no_wrap=True, overflow="ellipsis")
        now = time.monotonic()
        if self.live.is_started and now - self.last_refresh >= PROGRESS_REFRESH_S:
            self.last_refresh = now
            self.live.refresh()  # otherwise the next snapshot's update shows it (within a second)

    def progress_lines(self) -> list[Text]:
        """One line per task redrawing a bar (plan order), the rest counted."""
        tasks = sorted(self.bars, key=lambda t: self.order.get(t, len(self.order)))
        lines = [self.bars[t] for t in tasks[:MAX_PROGRESS_LINES]]
        if len(tasks) > MAX_PROGRESS_LINES:
            lines.append(
                Text(f"… and {len(tasks) - MAX_PROGRESS_LINES} more tasks drawing a progress bar", style="dim")
            )
        return lines

    def update(self, status: dict[str, Any]) -> None:
        self.body = self._render(status)
        self.last_refresh = time.monotonic()
        self.live.refresh()

    def _render(self, status: dict[str, Any]) -> Table | Text:
        if len(self.plan.nodes) > FULL_UP_TO:  # a thousand rows help nobody (and cost a render each time)
            return self._summary(status)
        title = f"{self.plan.job} — {status.get('state', 'starting')}"
        rows = self._rows(status.get("tasks", {}))
        width = self.console.width
        unbounded = self.console.options.update_width(1 << 20)  # its natural width, not clamped to the terminal's
        limits: dict[str, int | None] = {}
        table = _table(title, rows, limits)
        for col, limit in FIT_STEPS:  # narrow or drop, lowest priority first, until it fits
            if Measurement.get(self.console, unbounded, table).maximum <= width:
                break
            limits[col] = limit if limit is not None else 0
            table = _table(title, rows, limits)
        return table

    def _rows(self, tasks: dict[str, Any]) -> list[dict[str, str | Text]]:
        rows: list[dict[str, str | Text]] = []
        for node in self.plan.nodes:
            t = tasks.get(str(node.task), {})
            gpus = t.get("gpus") or []
            gpu = f"{sum(g.get('util', 0) for g in gpus) / len(gpus):.0f}" if gpus else "-"
            step_time = t.get("step_time_s")
            age = t.get("last_heartbeat_age_s")
            state = str(t.get("state", "pending"))
            style = {"failed": "red", "lost": "red", "succeeded": "green", "stopped": "yellow"}.get(state, "")
            cells = (
                str(node.task),
                Text(safe_text(str(t.get("host") or node.host))),  # a Slurm run learns its nodes when it starts
                Text(state, style=style),
                _fmt(t.get("steps"), "d"),
                "-" if step_time is None else f"{step_time * 1000:.1f}",
                _fmt(t.get("examples_per_s"), ".0f"),
                _fmt(t.get("cpu_pct"), ".0f"),
                _fmt(t.get("rss_mb"), ".0f"),
                gpu,
                "-" if age is None else f"{age:.1f}s",
                Text(_flags(t), style="bold yellow"),
            )
            rows.append(dict(zip(COLUMNS, cells, strict=True)))
        return rows

    def _summary(self, status: dict[str, Any]) -> Text:
        """A large job: counts per state, slowest/fastest, stragglers, failed or lost, silent (``summary``)."""
        tasks = status.get("tasks") or {str(n.task): {"state": "pending"} for n in self.plan.nodes}
        text = Text(f"{self.plan.job} — {status.get('state', 'starting')}\n", style="bold")
        for line in summary_lines(summarize(tasks), finished=bool(status.get("finished"))):
            style = "red" if line.startswith("failed") else "yellow" if line.startswith("stragglers") else ""
            text.append(line + "\n", style=style)
        return text


def _table(title: str, rows: list[dict[str, str | Text]], limits: dict[str, int | None]) -> Table:
    """The table with the columns ``limits`` leaves (0: dropped; n: at most n wide, ellipsis)."""
    table = Table(title=title, title_justify="left", expand=False, show_edge=False, pad_edge=False)
    cols = [c for c in COLUMNS if limits.get(c) != 0]
    for col in cols:
        table.add_column(col, no_wrap=True, max_width=limits.get(col), overflow="ellipsis")
    for row in rows:
        table.add_row(*(row[c] for c in cols))
    return table


def _flags(task: dict[str, Any]) -> str:
    """The straggler mark and the task's GPU problems (the monitor's judgement), for the last column."""
    flags = ["straggler"] if task.get("straggler") else []
    problems = sorted({str(g.get("problem")) for g in task.get("gpu_problems") or []})
    return " ".join([*flags, *(f"GPU {p}" for p in problems)])
