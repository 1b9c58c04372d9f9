"""The end of a run, recorded once: ``job_finished`` (its terminal event) and result.json.

Whoever ends a run — the launcher's job, the Slurm view that finalizes a run whose allocation died
with its supervisor, the Slurm submit that sbatch refused — records it here, so the two always go
together and result.json has one writer. ``tfcluster gather`` updating the gather of a finished run
goes through here too.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from ..core.result import Failure, RunResult
from ..events import EventBus
from ..events import kinds as ev
from ..runs import RunDir, write_json_atomic
from ..runs.reserve import release
from .files import EventFileSink


def record_result(rundir: RunDir, result: RunResult, bus: EventBus | None = None, **extra: Any) -> dict[str, Any]:
    """Emit ``job_finished`` and write result.json (``extra``: fields beside the result, such as
    ``run_dir_error``). Without a bus (nobody supervises the run any more) the event is appended to
    events.jsonl directly. Returns what result.json holds; OSError if it could not be written."""
    data = {**result.to_dict(), **extra}
    own = bus is None
    bus = bus or EventBus([EventFileSink(rundir.events_jsonl)])
    try:
        bus.emit(
            ev.JobFinished(
                state=result.state.value,
                wall_time_s=data["wall_time_s"],
                run_dir=str(rundir.path),
                root_cause=data["root_cause"],
            )
        )
    finally:
        if own:
            bus.close()
    write_json_atomic(rundir.result_json, data)  # on a full disk, with the run's reserve
    release(rundir.path)
    return data


def record_gather(rundir: RunDir, summary: dict[str, Any]) -> None:
    """A later ``tfcluster gather`` completed the run's gather: result.json says so (if there is one)."""
    data = rundir.read_json(rundir.result_json)
    if isinstance(data, dict):
        data["gather"] = summary
        data["gather_error"] = None
        write_json_atomic(rundir.result_json, data)


def print_root_cause(rc: Failure, out: IO[str] | None = None) -> None:
    """The root cause of a run that did not succeed, after its last event (the launcher's last words)."""
    out = out or sys.stderr
    where = f"{rc.task} on {rc.host}" if rc.task else "the job"
    print(f"\nroot cause: {where}: {rc.message}", file=out)
    if rc.hint:
        print(f"  fix: {rc.hint}", file=out)
    if rc.last_lines:
        print(f"last lines of {rc.task}:", file=out)
        for line in rc.last_lines[-10:]:
            print(f"  | {line}", file=out)
