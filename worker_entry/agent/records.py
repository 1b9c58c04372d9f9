"""The training process's records, as the node agent reads them from the progress pipe
(``TFCLUSTER_PROGRESS_FD``: one JSON object a line; docs/architecture.md, "Progress records").

Each is validated with the protocol's own records: the latest ``progress`` is kept for the next
heartbeat (counters are cumulative: a dropped record loses nothing), ``strategy``, ``profile``,
``evaluation`` and ``hint`` are sent on as messages, and the first sign of training (a progress record, the
strategy, or the TF server listening) is the task's ``started``. A bad record is skipped, and said
once on the task's stderr: the agent never stops over what the user's process wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .. import protocol as p

MAX_RECORD = 64 * 1024  # a progress record longer than this is not one


class ProgressRecords:
    def __init__(self, send: Callable[[p.Message], None], warn: Callable[[bytes], None]) -> None:
        """``send``: a message to the launcher; ``warn``: a line for the task's stderr."""
        self.send = send
        self.warn = warn
        self.buf = b""
        self.progress: p.Progress | None = None  # the latest, for the next heartbeat
        self.started_how: str | None = None
        self.bad_records = 0

    def feed(self, data: bytes) -> None:
        """Bytes read from the pipe: every complete record in them."""
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > MAX_RECORD:
            self.buf = b""  # not a record stream: a record is one short line
        for line in lines:
            self.record(line)

    def record(self, line: bytes) -> None:
        """One record from the training process; a bad one is skipped."""
        try:
            rec = json.loads(line)
            kind = rec.get("kind") if isinstance(rec, dict) else None
            if kind == "progress":
                self.progress = p.Progress.from_dict(rec)
                self.mark_started("progress")
            elif kind == "strategy":
                self.mark_started("strategy")
                self.send(p.StrategyInfo.from_dict(rec))
            elif kind in ("profile", "evaluation", "hint"):
                self.send(p.NODE_MESSAGES[kind].from_dict(rec))
        except (ValueError, RecursionError, p.ProtocolError) as exc:
            self.bad_records += 1
            if self.bad_records == 1:
                self.warn(f"worker_entry: ignoring a bad progress record ({str(exc)[:200]})\n".encode())

    def mark_started(self, how: str) -> None:
        """The task trains (``how``: the first sign of it), said once."""
        if self.started_how is None:
            self.started_how = how
            self.send(p.Started(how=how))  # type: ignore[arg-type]
