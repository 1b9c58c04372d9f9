"""Connections a backend refused: counted, the recent ones kept, reported at a bounded rate.

Anyone who can reach the connect-back port can make the supervisor refuse connections, so what is kept
is bounded (a count, the last ``RECENT``) and what is reported is rate-limited: the first refusal at
once, then at most one report per ``REPORT_INTERVAL_S`` summing up the refusals since the last one
(the supervisor turns each into a ``connection_refused`` event; ``status`` shows the count and the
recent ones). Reasons are the launcher's own words: nothing a peer sent is quoted.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

RECENT = 10
REPORT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class RefusalReport:
    """Refusals since the last report: how many, the first of them, and the total so far."""

    count: int
    peer: str
    reason: str
    total: int


class Refusals:
    def __init__(self, interval_s: float = REPORT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.total = 0
        self._recent: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=RECENT)
        self._reported = 0
        self._first_unreported: tuple[str, str] | None = None
        self._last_report: float | None = None
        self._lock = threading.Lock()

    def add(self, peer: str, reason: str) -> None:
        with self._lock:
            self.total += 1
            self._recent.append((time.time(), peer, reason))
            if self._first_unreported is None:
                self._first_unreported = (peer, reason)

    def report(self, now: float | None = None, *, final: bool = False) -> RefusalReport | None:
        """What to report now, if anything (the first refusal at once, then once per interval; ``final``:
        the attempt ends, so whatever is unreported, at once — events.jsonl then counts what status does)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._first_unreported is None:
                return None
            if not final and self._last_report is not None and now - self._last_report < self.interval_s:
                return None
            peer, reason = self._first_unreported
            out = RefusalReport(self.total - self._reported, peer, reason, self.total)
            self._reported, self._first_unreported, self._last_report = self.total, None, now
            return out

    def summary(self) -> dict[str, Any]:
        """For status.json: the total and the recent ones (newest last)."""
        with self._lock:
            recent = [{"ts": round(ts, 3), "peer": peer, "reason": reason} for ts, peer, reason in self._recent]
            return {"count": self.total, "recent": recent}

    def recent(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(peer, reason) for _, peer, reason in self._recent]
