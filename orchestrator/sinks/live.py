"""The live per-worker table on an interactive terminal (rich). Logs scroll above it.

Up to ``summary.FULL_UP_TO`` tasks one a row; a larger job gets its summary (counts per state, the
slowest and fastest tasks, stragglers, failed or lost, the longest silent), a few lines whatever the
task count, redrawn only when a new snapshot comes (every second up to 4,096 tasks, less often beyond).

Only used when stdout is a terminal; pipes and files get plain prefixed lines.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..core.terminal import safe_text
from ..plan import Plan
from ..supervise.summary import FULL_UP_TO, summarize, summary_lines


def _fmt(value: Any, fmt: str, empty: str = "-") -> str:
    return empty if value is None else format(value, fmt)


class LiveTable:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.console = Console(file=sys.stdout)
        self.live = Live(
            self._render({}),
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
            self.live.stop()

    def print_log(self, data: bytes) -> None:
        if not self.live.is_started:
            sys.stdout.buffer.write(data)
            return
        text = safe_text(data.decode("utf-8", "replace"), keep_sgr=True)  # already made safe: once more is free
        self.console.print(Text.from_ansi(text.rstrip("\n")), soft_wrap=True, highlight=False, markup=False)

    def update(self, status: dict[str, Any]) -> None:
        self.live.update(self._render(status), refresh=True)

    def _render(self, status: dict[str, Any]) -> Table | Text:
        if len(self.plan.nodes) > FULL_UP_TO:  # a thousand rows help nobody (and cost a render each time)
            return self._summary(status)
        table = Table(
            title=f"{self.plan.job} — {status.get('state', 'starting')}",
            title_justify="left",
            expand=False,
            show_edge=False,
            pad_edge=False,
        )
        for col in ("task", "host", "state", "step", "step ms", "ex/s", "cpu%", "rss MB", "gpu%", "heartbeat", ""):
            table.add_column(col, no_wrap=True)
        tasks = status.get("tasks", {})
        for node in self.plan.nodes:
            t = tasks.get(str(node.task), {})
            gpus = t.get("gpus") or []
            gpu = f"{sum(g.get('util', 0) for g in gpus) / len(gpus):.0f}" if gpus else "-"
            step_time = t.get("step_time_s")
            age = t.get("last_heartbeat_age_s")
            state = str(t.get("state", "pending"))
            style = {"failed": "red", "lost": "red", "succeeded": "green", "stopped": "yellow"}.get(state, "")
            table.add_row(
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
        return table

    def _summary(self, status: dict[str, Any]) -> Text:
        """A large job: counts per state, slowest/fastest, stragglers, failed or lost, silent (``summary``)."""
        tasks = status.get("tasks") or {str(n.task): {"state": "pending"} for n in self.plan.nodes}
        text = Text(f"{self.plan.job} — {status.get('state', 'starting')}\n", style="bold")
        for line in summary_lines(summarize(tasks), finished=bool(status.get("finished"))):
            style = "red" if line.startswith("failed") else "yellow" if line.startswith("stragglers") else ""
            text.append(line + "\n", style=style)
        return text


def _flags(task: dict[str, Any]) -> str:
    """The straggler mark and the task's GPU problems (the monitor's judgement), for the last column."""
    flags = ["straggler"] if task.get("straggler") else []
    problems = sorted({str(g.get("problem")) for g in task.get("gpu_problems") or []})
    return " ".join([*flags, *(f"GPU {p}" for p in problems)])
