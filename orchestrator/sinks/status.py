"""status.json (rewritten every second, read by `tfcluster status`) and the live table."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..runs import RunDir, write_json_atomic
from ..supervise.figures import Figures, throughput
from ..supervise.status import final_tasks


class StatusWriter:
    """Writes each status snapshot atomically. The final one (``finished``) is built here, once: the
    result's tasks with what was last seen of each and their whole-run figures (``figures``, the
    job's accumulator: the figures ``report`` computes from heartbeats.jsonl); `status` shows it as is."""

    def __init__(self, rundir: RunDir, job: str, run_id: str, live: Any = None, figures: Figures | None = None) -> None:
        self.rundir = rundir
        self.job = job
        self.run_id = run_id
        self.live = live
        self.figures = figures
        self._last_tasks: dict[str, dict[str, Any]] = {}  # what was last seen of each task, the newest aside
        self._newest: dict[str, dict[str, Any]] = {}  # the newest live snapshot's tasks: merged only when needed
        self._refused: Any = None  # the supervisor's last count of refused connections, kept to the end

    def __call__(self, status: dict[str, Any]) -> None:
        if status.get("finished"):
            self._last_tasks.update(self._newest)
            self._newest = {}
            status["tasks"] = final_tasks(self._last_tasks, status.get("tasks", {}), self.figures)
            status["throughput"] = throughput(self.figures.final()) if self.figures is not None else None
        else:
            # every snapshot names every task (of the attempt): the newest alone says what was last seen of
            # them, the older merged in only when the newest lacks some (4,096 stores a second saved)
            tasks = status.get("tasks", {})
            if not tasks.keys() >= self._newest.keys():
                self._last_tasks.update(self._newest)
            self._newest = tasks
        if "refused_connections" in status:
            self._refused = status["refused_connections"]
        elif self._refused is not None:
            status["refused_connections"] = self._refused
        status = {"job": self.job, "run_id": self.run_id, "launcher_pid": os.getpid(), **status}
        with contextlib.suppress(OSError):
            write_json_atomic(self.rundir.status_json, status, indent=None, durable=False)
        if self.live is not None and self.live.active:
            self.live.update(status)
