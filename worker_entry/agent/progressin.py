"""The training process's progress records, as worker_entry reads them (fd ``TFCLUSTER_PROGRESS_FD``).

One JSON object a line (docs/architecture.md, "Progress records"), validated with the protocol's
records; a bad one is skipped (the caller says so once). Read to the end after the process exited:
its last record, written at its exit, counts its last steps.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .. import protocol as p

MAX_RECORD = 64 * 1024  # a progress record longer than this is not one
KINDS = {"progress": p.Progress, "strategy": p.StrategyInfo}


class ProgressPipe:
    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.buf = b""
        self.bad = 0  # records skipped
        self.error = ""  # why the last one was
        self.got = 0  # bytes the last read returned (0: nothing there for now)
        os.set_blocking(fd, False)

    def read(self) -> list[Any] | None:
        """The records the pipe holds now, validated ([]: none yet); None at its end (fd closed)."""
        if self.fd is None:
            return None
        self.got = 0
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            os.close(self.fd)
            self.fd = None
            return None
        self.got = len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > MAX_RECORD:
            self.buf = b""  # not a record stream: a record is one short line
        return [r for r in map(self._record, lines) if r is not None]

    def _record(self, line: bytes) -> Any:
        try:
            rec = json.loads(line)
            kind = rec.get("kind") if isinstance(rec, dict) else None
            record = KINDS.get(kind) or (p.NODE_MESSAGES[kind] if kind in ("profile", "evaluation") else None)
            return record.from_dict(rec) if record is not None else None
        except (ValueError, RecursionError, p.ProtocolError) as exc:
            self.bad += 1
            self.error = str(exc)[:200]
            return None
