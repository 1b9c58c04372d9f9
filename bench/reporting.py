"""The benchmark scripts' results: medians, number formatting, the machine's facts, and ``Report`` (a
titled table, notes, what each test bed left behind, and ONE ratio printed last, or one JSON object).
Split from ``common`` (which re-exports every name here)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

_CLEANUP: list[dict[str, Any]] = []
_T0 = time.monotonic()


def record_cleanup(rec: dict[str, Any]) -> None:
    """What a stopped test bed left behind (``common.testbed``), for the report's cleanup line."""
    _CLEANUP.append(rec)


def cleanup_records() -> list[dict[str, Any]]:
    return list(_CLEANUP)


# ---------------------------------------------------------------------------------------- stats


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == float("inf"):
            return "inf"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{nd}f}"
    return str(v)


def _cmd_version(argv: list[str]) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (r.stdout + r.stderr).strip().splitlines()
    return text[0] if text else None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpu_model": None,
        "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "openssh": _cmd_version(["ssh", "-V"]),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(Exception):
        import paramiko

        info["paramiko"] = paramiko.__version__
    if shutil.which("pdsh"):
        info["pdsh"] = _cmd_version(["pdsh", "-V"])
    return info


# --------------------------------------------------------------------------------------- report


@dataclass
class Report:
    """A titled table (list of row dicts), notes, and ONE ratio printed last."""

    title: str
    columns: list[tuple[str, str]]  # (key, header)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_tables: list[tuple[str, list[tuple[str, str]], list[dict[str, Any]]]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    ratio_name: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    started: float = field(default_factory=lambda: _T0)

    def set_ratio(self, name: str, value: float | None, target: str, passed: bool | None) -> None:
        self.ratio_name, self.ratio, self.target, self.passed = name, value, target, passed

    @staticmethod
    def _table(columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> str:
        cells = [[h for _, h in columns]] + [[fmt(r.get(k)) for k, _ in columns] for r in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        lines = []
        for j, row in enumerate(cells):
            parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
            lines.append("  ".join(parts).rstrip())
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def emit(self, as_json: bool) -> None:
        if as_json:
            out = {
                "benchmark": self.title,
                "machine": machine_info(),
                "rows": self.rows,
                "tables": {name: rows for name, _, rows in self.extra_tables},
                "notes": self.notes,
                "data": self.data,
                "cleanup": cleanup_records(),
                "seconds": round(time.monotonic() - self.started, 1),
                "ratio": {"name": self.ratio_name, "value": self.ratio, "target": self.target, "passed": self.passed},
            }
            print(json.dumps(out, indent=2, default=str))
            return
        m = machine_info()
        print(f"== {self.title}")
        print(
            f"   {m['date']}  {m['cpus']} cores {m['cpu_model'] or ''}  load {m['load_avg']}  "
            f"python {m['python']}  {m['openssh'] or ''}"
        )
        print()
        print(self._table(self.columns, self.rows))
        for name, cols, rows in self.extra_tables:
            print()
            print(name)
            print(self._table(cols, rows))
        if self.notes:
            print()
            for n in self.notes:
                print(f"note: {n}")
        clean = cleanup_records()
        left = [c for c in clean if c["leftovers"] or c["stop_errors"]]
        print()
        print(
            f"cleanup: {len(clean)} test bed(s) stopped, "
            + ("nothing left behind" if not left else f"LEFT BEHIND: {left}")
            + f"; {time.monotonic() - self.started:.0f}s total"
        )
        verdict = "" if self.passed is None else ("  PASS" if self.passed else "  MISS")
        print(f"ratio: {self.ratio_name} = {fmt(self.ratio, 3)}  (target {self.target}){verdict}")
