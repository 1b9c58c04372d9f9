"""A job's tasks in a few lines: what stays readable at a thousand tasks (live table, ``tfcluster status``).

Pure: from the status snapshot's ``tasks`` (status.json) to counts per state, the slowest and fastest
tasks by step time, the stragglers, the tasks that failed or were lost, and the longest-silent ones.
A job of up to ``FULL_UP_TO`` tasks is shown whole instead (every row fits on a screen).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FULL_UP_TO = 32  # tasks shown one a row; beyond, the summary (``--all`` shows every task)
TOP = 5  # slowest / fastest / silent tasks named
SILENT_S = 2.0  # a heartbeat older than this is worth naming (the default interval is 1 s)
BAD_STATES = ("failed", "lost", "not_started")


@dataclass
class Summary:
    total: int
    states: dict[str, int]
    slowest: list[tuple[str, float]] = field(default_factory=list)  # (task, step time s), slowest first
    fastest: list[tuple[str, float]] = field(default_factory=list)
    median_step_s: float | None = None
    stragglers: list[str] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (task, state) failed / lost / never started
    silent: list[tuple[str, float]] = field(default_factory=list)  # (task, heartbeat age s), oldest first


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def summarize(tasks: Mapping[str, Mapping[str, Any]], top: int = TOP) -> Summary:
    states = Counter(str(t.get("state", "pending")) for t in tasks.values())
    times = sorted(
        ((st, name) for name, t in tasks.items() if (st := _num(t.get("step_time_s"))) is not None), reverse=True
    )
    ages = sorted(
        ((a, name) for name, t in tasks.items() if (a := _num(t.get("last_heartbeat_age_s"))) is not None), reverse=True
    )
    return Summary(
        total=len(tasks),
        states=dict(sorted(states.items(), key=lambda kv: (-kv[1], kv[0]))),
        slowest=[(n, s) for s, n in times[:top]],
        fastest=[(n, s) for s, n in reversed(times[-top:])] if len(times) > top else [],
        median_step_s=times[len(times) // 2][0] if times else None,
        stragglers=[name for name, t in tasks.items() if t.get("straggler")],
        bad=[(name, str(t.get("state"))) for name, t in tasks.items() if t.get("state") in BAD_STATES],
        silent=[(n, a) for a, n in ages[:top] if a >= SILENT_S],
    )


def _names(items: list[tuple[str, float]], unit: str, scale: float = 1.0, fmt: str = ".1f") -> str:
    return ", ".join(f"{name} {format(v * scale, fmt)}{unit}" for name, v in items)


def summary_lines(s: Summary, *, finished: bool = False) -> list[str]:
    """The summary as text lines (``tfcluster status``; the live table shows the same figures)."""
    lines = [f"{s.total} tasks: " + ", ".join(f"{n} {state}" for state, n in s.states.items())]
    if s.median_step_s is not None:
        lines.append(f"step time: median {s.median_step_s * 1000:.1f} ms")
        lines.append(f"  slowest: {_names(s.slowest, ' ms', 1000)}")
        if s.fastest:
            lines.append(f"  fastest: {_names(s.fastest, ' ms', 1000)}")
    if s.stragglers:
        lines.append(f"stragglers: {', '.join(s.stragglers)}")
    if s.bad:
        shown = ", ".join(f"{name} ({state})" for name, state in s.bad[:20])
        more = f" and {len(s.bad) - 20} more" if len(s.bad) > 20 else ""
        lines.append(f"failed, lost or not started: {shown}{more}")
    if s.silent and not finished:
        lines.append(f"longest silent: {_names(s.silent, 's ago')}")
    return lines
