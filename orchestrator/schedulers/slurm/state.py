"""RUN/slurm.json: what a Slurm run knows across allocations, and RUN/slurm/stop.json, the stop request.

A Slurm run outlives its processes: the login node's follower submits and watches, a supervisor runs
in each allocation (a requeued job starts a new one), ``tfcluster status``/``stop`` come and go. They
share this file: the job ids (a resubmission adds one), the requeue counters, every allocation, and
the attempts of allocations that ended (the next supervisor continues the numbering and writes them
all into result.json). One writer at a time by construction: the follower before submitting and after
the job is gone, the supervisor while it runs. Read tolerantly (a torn or foreign file is "empty").
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...runs import RunDir, write_json_atomic

JOB_ID_RE = re.compile(r"^\d{1,12}$")
STOP_SIGNALS = ("SIGTERM", "SIGINT")


@dataclass
class SlurmState:
    run_id: str
    mode: str = "batch"  # batch: submitted by tfcluster; allocation: launched inside the user's allocation
    job_ids: list[str] = field(default_factory=list)
    gather: bool = True  # `launch --no-gather`: no hand-over of logs and checkpoint
    preemptions: int = 0
    timeouts: int = 0
    requeues: int = 0
    allocations: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # AttemptResult.to_dict() of ended allocations

    @property
    def job_id(self) -> str | None:
        """The current Slurm job (the last one submitted)."""
        return self.job_ids[-1] if self.job_ids else None

    @staticmethod
    def path(rundir: RunDir) -> Path:
        return rundir.slurm_json

    @classmethod
    def load(cls, rundir: RunDir) -> SlurmState | None:
        """The run's Slurm state, or None when this is not a Slurm run (or the file is not ours)."""
        data = rundir.read_json(cls.path(rundir))
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            return None
        try:
            state = cls(
                run_id=data["run_id"],
                mode=data.get("mode") if data.get("mode") in ("batch", "allocation") else "batch",
                job_ids=[j for j in data.get("job_ids", []) if isinstance(j, str) and JOB_ID_RE.match(j)],
                gather=data.get("gather") is not False,
                preemptions=_count(data.get("preemptions")),
                timeouts=_count(data.get("timeouts")),
                requeues=_count(data.get("requeues")),
                allocations=[a for a in data.get("allocations", []) if isinstance(a, dict)][-10000:],
                attempts=[a for a in data.get("attempts", []) if isinstance(a, dict)][-10000:],
            )
        except (TypeError, ValueError, AttributeError):
            return None
        return state

    def save(self, rundir: RunDir) -> None:
        write_json_atomic(self.path(rundir), asdict(self))
        os.chmod(self.path(rundir), 0o600)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1_000_000 else 0


def stop_request_path(rundir: RunDir) -> Path:
    return rundir.slurm_stop_json


def request_stop(rundir: RunDir, signal_name: str, by: str) -> None:
    """Say why the supervisor is about to get SIGTERM: a user's stop, not a preemption."""
    path = stop_request_path(rundir)
    path.parent.mkdir(exist_ok=True, mode=0o700)
    write_json_atomic(path, {"signal": signal_name, "by": by, "ts": time.time()})


def stop_requested(rundir: RunDir) -> str | None:
    """The signal name of a user's stop request (SIGTERM: `tfcluster stop`; SIGINT: Ctrl-C), or None."""
    data = rundir.read_json(stop_request_path(rundir))  # (no link, no FIFO, bounded)
    if data is None:
        return None
    sig = data.get("signal") if isinstance(data, dict) else None
    return sig if sig in STOP_SIGNALS else ("SIGTERM" if data is not None else None)
