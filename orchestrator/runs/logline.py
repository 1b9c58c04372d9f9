"""combined.log's line format, written by the launcher's log router and read by ``tfcluster logs``, the
Slurm follower and the reports: ``<UTC time> [<task> <host>] <line>``, or ``<UTC time> [tfcluster] <note>``
for the launcher's own notes (attempt boundaries). One codec, so the two sides cannot drift apart."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

NOTE = "tfcluster"  # the tag of the launcher's own lines
_LINE = re.compile(r"^(\S+) \[([^\]]*)\] ?(.*)$", re.DOTALL)
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


#: The last whole second formatted, and its text up to the decimal point: one tuple, replaced whole, so
#: a thread that reads it never pairs one second with another's text.
_second: tuple[int | None, str] = (None, "")


def iso(ts: float) -> str:
    """A Unix time as combined.log writes it: UTC, milliseconds (truncated), ``Z``. Every task's line is
    stamped, so the second's text is kept: the fraction is split as ``datetime.fromtimestamp`` splits it
    (microseconds rounded half to even, 1,000,000 carried), and the same text comes out."""
    global _second
    if not math.isfinite(ts):
        return datetime.fromtimestamp(ts, UTC).isoformat()  # raises as before
    second = math.floor(ts)
    micros = round((ts - second) * 1e6)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    kept = _second
    if kept[0] != second:
        kept = _second = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S."))
    return f"{kept[1]}{micros // 1000:03d}Z"


def parse_iso(text: str) -> float | None:
    try:
        return datetime.strptime(text, _TS_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def tag(task: str, host: str) -> str:
    """``[task host] `` — what every line of a task carries, in combined.log and on the console."""
    return f"[{task} {host}] "


def stamp(ts: float) -> bytes:
    return (iso(ts) + " ").encode()


def note_line(ts: float, text: str) -> bytes:
    return f"{iso(ts)} [{NOTE}] {text}\n".encode()


@dataclass(frozen=True)
class LogLine:
    ts_text: str
    tag: str  # "worker:1 10.0.0.2", or "tfcluster"
    body: str

    @property
    def task(self) -> str:
        return self.tag.split(" ", 1)[0]

    @property
    def is_note(self) -> bool:
        return self.task == NOTE

    @property
    def ts(self) -> float | None:
        return parse_iso(self.ts_text)


def parse_line(text: str) -> LogLine | None:
    """A combined.log line (without its newline); None for anything else (a foreign or torn line)."""
    m = _LINE.match(text)
    return LogLine(*m.groups()) if m else None
