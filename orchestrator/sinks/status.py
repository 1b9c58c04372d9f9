"""status.json (rewritten every second, read by `tfcluster status`) and the live table."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..runs import RunDir, write_json_atomic


class StatusWriter:
    """Writes each status snapshot atomically; the final one keeps the last metrics of every task
    and takes states and exit codes from the result."""

    def __init__(self, rundir: RunDir, job: str, run_id: str, live: Any = None) -> None:
        self.rundir = rundir
        self.job = job
        self.run_id = run_id
        self.live = live
        self._last_tasks: dict[str, dict[str, Any]] = {}
        self._refused: Any = None  # the supervisor's last count of refused connections, kept to the end

    def __call__(self, status: dict[str, Any]) -> None:
        if status.get("finished"):
            status["tasks"] = {t: {**self._last_tasks.get(t, {}), **v} for t, v in status.get("tasks", {}).items()}
        else:
            self._last_tasks.update(status.get("tasks", {}))
        if "refused_connections" in status:
            self._refused = status["refused_connections"]
        elif self._refused is not None:
            status["refused_connections"] = self._refused
        status = {"job": self.job, "run_id": self.run_id, "launcher_pid": os.getpid(), **status}
        with contextlib.suppress(OSError):
            write_json_atomic(self.rundir.status_json, status, indent=None, durable=False)
        if self.live is not None and self.live.active:
            self.live.update(status)
