"""Submit a run from a login node: the run directory, the batch script, ``sbatch``.

The run directory must be on storage the compute nodes share (home directories usually are): the
batch job's supervisor writes its logs, events, status and result there, and the login node follows
them. Everything written here is private (files 0600 under a 0700 directory); the batch script holds
only quoted paths, the options are sbatch arguments (no shell), and no secret exists yet — the
supervisor makes the connect-back secret inside the allocation. The spec itself, whose env may hold
credentials, travels as RUN/slurm/private-spec.json (0600; ``private_spec``), never in the job's
environment, which Slurm stores; RUN/spec.yaml is the redacted copy, as for every run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import UsageError
from ...core.result import Failure, RunResult
from ...core.states import JobState
from ...events import EventBus
from ...events import kinds as ev
from ...plan import Plan
from ...runs import RunDir, write_json_atomic, write_plan, write_private
from ...sinks import EventFileSink
from ...sinks.record import record_result
from ...spec import LoadedSpec
from ...spec.redact import redacted_text
from . import commands as sc
from .plan import batch_script, sbatch_argv
from .private_spec import remove_private_spec, write_private_spec
from .state import SlurmState
from .versions import requeue_option, slurm_version


@dataclass(frozen=True)
class Submitted:
    rundir: RunDir
    job_id: str | None  # None: sbatch refused (result.json says why)
    argv: list[str]


def submitted_path(rundir: RunDir) -> Path:
    """RUN/slurm/submitted.json: the follower's record of sbatch's answer (slurm.json is the supervisor's)."""
    return rundir.slurm_dir / "submitted.json"


def submit(
    loaded: LoadedSpec, plan: Plan, run_dir: str | None, command: list[str] | None, *, gather: bool = True
) -> Submitted:
    """Create the run directory and submit the batch job. sbatch refusing is recorded as the run's result."""
    if not sc.have("sbatch"):
        raise UsageError("scheduler: slurm needs sbatch: run on a Slurm login node (or inside an allocation)")
    rundir = RunDir.create(run_dir or os.path.join("runs", plan.run_id))
    rundir = RunDir(rundir.path.resolve())  # the compute nodes see it by its absolute path
    sdir = rundir.slurm_dir
    sdir.mkdir(mode=0o700, exist_ok=True)
    write_private(rundir.spec_yaml, redacted_text(loaded))
    write_private_spec(rundir, loaded, command)
    write_plan(rundir, plan)
    SlurmState(run_id=plan.run_id, mode="batch", gather=gather).save(rundir)
    script = sdir / "job.sh"
    write_private(script, batch_script(sys.executable, str(rundir.path), plan.run_id), 0o700)
    argv = sbatch_argv(loaded.spec, str(rundir.path), str(script), plan.run_id)
    argv = [requeue_option(True, slurm_version()) if a == "--requeue" else a for a in argv]  # 25.11+: expedite
    write_private(sdir / "sbatch.json", json.dumps(argv, indent=2) + "\n")
    try:
        job_id = sc.submit(argv)
    except sc.SlurmError as exc:
        remove_private_spec(rundir)
        _refused(rundir, plan, str(exc), loaded.spec.restart.max_restarts + 1)
        return Submitted(rundir, None, argv)
    write_json_atomic(submitted_path(rundir), {"job_id": job_id, "ts": time.time()})
    return Submitted(rundir, job_id, argv)


def _refused(rundir: RunDir, plan: Plan, message: str, attempt_limit: int) -> None:
    """Nothing ran: result.json (START_FAILED) with Slurm's own words as the root cause."""
    hint = "check slurm.partition/account/qos/time/constraint/extra_args against `sinfo` and your associations"
    record_not_run(
        rundir, plan.job, plan.run_id, len(plan.nodes), attempt_limit, f"sbatch refused the job: {message}", hint
    )


def record_not_run(
    rundir: RunDir, job: str, run_id: str, tasks: int, attempt_limit: int, message: str, hint: str | None = None
) -> RunResult:
    """A run that never started a task: its job_started, its root cause and result.json (START_FAILED)."""
    now = time.time()
    result = RunResult(
        job,
        run_id,
        str(rundir.path),
        JobState.START_FAILED,
        now,
        now,
        failures=[Failure("scheduler", message, now, hint=hint)],
    )
    bus = EventBus([EventFileSink(rundir.events_jsonl)])
    try:
        bus.emit(
            ev.JobStarted(job=job, run_id=run_id, run_dir=str(rundir.path), tasks=tasks, attempt_limit=attempt_limit)
        )
        record_result(rundir, result, bus)
    finally:
        bus.close()
    return result
