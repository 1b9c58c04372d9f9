"""The live per-worker table on an interactive terminal (rich). Logs scroll above it.

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


def _fmt(value: Any, fmt: str, empty: str = "-") -> str:
    return empty if value is None else format(value, fmt)


class LiveTable:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.console = Console(file=sys.stdout)
        self.live = Live(
            self._render({}),
            console=self.console,
            refresh_per_second=4,
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
        self.live.update(self._render(status))

    def _render(self, status: dict[str, Any]) -> Table:
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
                Text("straggler", style="bold yellow") if t.get("straggler") else "",
            )
        return table
