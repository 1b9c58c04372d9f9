"""Slurm runs seen from outside the allocation: the job's state, stopping it, and ending a run whose
supervisor could not (the job was cancelled while pending, or died with its allocation).

The supervisor of a submitted run lives in the allocation, usually on another machine: its pid in
launcher.json means nothing here, so liveness is the Slurm job's state (squeue → scontrol → sacct).
``stop`` leaves a stop request (so the SIGTERM is not taken for a preemption), signals only the batch
shell — the supervisor's own clean teardown — and scancels the whole job only if that did not end
the run in time. When the job is gone without a result.json, ``finalize`` writes one from what Slurm
and the run directory say, so ``status``, ``logs --follow`` and the exit code always have an end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.result import AttemptResult, Failure, RunResult
from ...core.states import JobState, interrupted_state
from ...runs import RunDir, open_regular, plan_or_none, read_tail, write_json_atomic
from ...sinks.record import record_result
from ...supervise.figures import Figures
from ...supervise.status import final_tasks
from ...views.handle import RunHandle, already_finished, stopped_text
from . import commands as sc
from .commands import JobInfo, SlurmError
from .plan import job_comment
from .private_spec import remove_private_spec
from .state import SlurmState, request_stop, stop_requested
from .submit import submitted_path

SETTLE_S = 5.0  # a job that just ended may have a result.json on its way (shared storage)
BATCH_STOP_S = 60.0  # how long the supervisor's own teardown may take before scancel of the whole job


def is_slurm_batch(run: RunDir) -> bool:
    state = SlurmState.load(run)
    return state is not None and state.mode == "batch"


def current_job(run: RunDir) -> str | None:
    """The run's current Slurm job: the supervisor's record, else what sbatch answered the follower."""
    state = SlurmState.load(run)
    if state is not None and state.job_id:
        return state.job_id
    data = run.read_json(submitted_path(run))
    job = data.get("job_id") if isinstance(data, dict) else None
    return job if isinstance(job, str) and job.isdigit() else None


def job_info(run: RunDir) -> JobInfo | None:
    job = current_job(run)
    return sc.job_info(job) if job else None


def slurm_status(run: RunDir) -> dict[str, Any]:
    """The ``slurm`` section of ``tfcluster status``."""
    state = SlurmState.load(run)
    info = job_info(run)
    out: dict[str, Any] = {"job_ids": state.job_ids if state else [], "mode": state.mode if state else None}
    if info is not None:
        out.update(info.to_dict())
    if state is not None:
        out.update(
            preemptions=state.preemptions,
            timeouts=state.timeouts,
            requeues=state.requeues,
            allocations=len(state.allocations),
        )
    return out


def supervisor_alive(run: RunDir) -> bool:
    """A submitted run is alive while its Slurm job holds or waits for an allocation."""
    info = job_info(run)
    return info is None or info.active


def finalize(run: RunDir, info: JobInfo | None = None) -> dict[str, Any] | None:
    """The job is gone and no supervisor wrote result.json: write it (and say so). None if still running."""
    if run.is_finished():
        return run.read_json(run.result_json)
    info = info or job_info(run)
    if info is not None and info.active:
        return None
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        if run.is_finished():
            return run.read_json(run.result_json)
        time.sleep(0.25)
    state = SlurmState.load(run)
    plan = plan_or_none(run)
    attempts = []
    for d in state.attempts if state else []:
        try:
            attempts.append(AttemptResult.from_dict(d))
        except (KeyError, TypeError, ValueError):
            continue
    now = time.time()
    stop = stop_requested(run)
    slurm_state = info.state if info is not None else "UNKNOWN"
    job = current_job(run)
    tail = out_tail(run, job)
    if stop:
        new, kind, msg = (
            interrupted_state(_signum(stop)),
            "scheduler",
            f"stopped by the user: Slurm job {job} {slurm_state}",
        )
    elif not attempts and not (state and state.allocations):
        new, kind, msg = (
            JobState.START_FAILED,
            "scheduler",
            f"Slurm job {job} ended ({slurm_state}) before tfcluster's supervisor started",
        )
    elif attempts and attempts[-1].state == JobState.REQUEUED:
        new, kind, msg = (
            JobState.FAILED,
            "scheduler",
            (
                f"Slurm job {job} ended ({slurm_state}) after its allocation was taken away, and was not started again "
                "(the partition's PreemptMode cancels instead of requeueing, or the job is not requeueable)"
            ),
        )
    elif slurm_state == "CANCELLED":
        new, kind, msg = JobState.INTERRUPTED_SIGTERM, "scheduler", f"Slurm job {job} was cancelled (scancel)"
    else:
        new, kind, msg = (
            JobState.FAILED,
            "scheduler",
            f"Slurm job {job} ended ({slurm_state}) without its supervisor writing a result",
        )
    hint = f"see {run.slurm_dir / f'slurm-{job}.out'}" + (f": {tail}" if tail else "")
    started = _started(run) or now
    result = RunResult(
        plan.job if plan else "",
        plan.run_id if plan else "",
        str(run.path),
        new,
        started,
        now,
        attempts=attempts,
        failures=[Failure(kind, msg, now, hint=hint)],
    )
    data = record_result(run, result)
    remove_private_spec(run)  # the run is over: its credentials go
    status = run.read_json(run.status_json) or {}
    live = status.get("tasks") if isinstance(status.get("tasks"), dict) else {}
    ended = data.get("tasks") or {t: {} for t in live}  # the outcome where known; what was seen, else
    tasks = final_tasks(live, ended, Figures.replay(run.heartbeats_jsonl))
    status.update(state=new.value, finished=True, updated=now, tasks=tasks)
    write_json_atomic(run.status_json, status, durable=False)
    return data


def _signum(name: str) -> int:
    import signal

    return int(getattr(signal, name, signal.SIGTERM))


def _started(run: RunDir) -> float | None:
    try:  # the first event (job_started), read as every run file is: no link, no FIFO, one bounded line
        with open_regular(run.events_jsonl) as f:
            first = json.loads(f.readline(1 << 16))
        return float(first["ts"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        data = run.read_json(submitted_path(run))
        return data.get("ts") if isinstance(data, dict) and isinstance(data.get("ts"), int | float) else None


def out_tail(run: RunDir, job: str | None, lines: int = 5) -> str:
    """The last lines of the batch job's output file (why a supervisor never started, say)."""
    if not job:
        return ""
    path: Path = run.slurm_dir / f"slurm-{job}.out"
    # (a link planted there leaked its target's tail into status and result.json; a FIFO hung status)
    data = read_tail(path, 4096).decode("utf-8", "replace")
    return " | ".join(line.strip() for line in data.strip().splitlines()[-lines:] if line.strip())[:1000]


def not_this_runs_job(run: RunDir, job: str) -> str | None:
    """Why Slurm job ``job`` is not this run's (None when it is): slurm.json is only a file, and ``stop``
    may run as root — so scancel only a job whose comment names this run (``--comment=tfcluster:RUN_ID``),
    whose name is the run's job and whose owner owns the run directory."""
    ident = sc.job_identity(job)
    if ident is None:
        return f"Slurm does not know job {job} (any more), or does not say whose it is"
    return _not_ours(run, ident)


def _not_ours(run: RunDir, ident: sc.JobIdentity) -> str | None:
    state = SlurmState.load(run)
    plan = plan_or_none(run)
    job_name = plan.job if plan else None
    if state is None or not state.run_id or not job_name:
        return "the run directory does not say which run it is (slurm.json, plan.json)"
    want = job_comment(state.run_id)
    if ident.comment != want:
        return f"its comment is {ident.comment!r}, not {want!r}"
    if ident.name != job_name:
        return f"its name is {ident.name!r}, not the run's job {job_name!r}"
    owner = run.path.stat().st_uid
    if ident.uid != owner:
        return f"it belongs to uid {ident.uid}, the run directory to uid {owner}"
    return None


def scancel_checked(run: RunDir, job: str, *, signal: str | None = None, batch_only: bool = False) -> None:
    """``scancel`` of the run's own job only (SlurmError saying why not, otherwise)."""
    why = not_this_runs_job(run, job)
    if why is not None:
        raise SlurmError(f"refusing to scancel Slurm job {job}: {why}")
    sc.cancel(job, signal=signal, batch_only=batch_only)


def cancel(run: RunDir, *, signal_name: str, by: str) -> str:
    """Ask the run to end: the supervisor's own teardown if it runs, scancel if the job only waits."""
    job = current_job(run)
    if job is None:
        return "no Slurm job recorded for this run"
    request_stop(run, signal_name, by)
    info = sc.job_info(job)
    try:
        if info.state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
            scancel_checked(run, job, signal="TERM", batch_only=True)  # only our supervisor: it stops the tasks cleanly
            return f"asked the supervisor of Slurm job {job} to stop"
        scancel_checked(run, job)
        return f"cancelled Slurm job {job} ({info.state.lower()})"
    except SlurmError as exc:
        return f"scancel: {exc}"


def stop_slurm(run: RunDir, *, timeout_s: float) -> str:
    """``tfcluster stop`` for a submitted run."""
    if run.is_finished():
        return already_finished(run)
    job = current_job(run)
    ident = sc.job_identity(job) if job else None
    why = _not_ours(run, ident) if ident is not None else None
    if why is not None:  # before the stop request: nothing of another job's is touched
        raise UsageError(f"refusing to scancel Slurm job {job}: {why}; scancel it yourself if it is yours")
    first = cancel(run, signal_name="SIGTERM", by="tfcluster stop")
    deadline = time.monotonic() + timeout_s
    hard_at = time.monotonic() + min(BATCH_STOP_S, timeout_s / 2)
    hard = False
    while time.monotonic() < deadline:
        if run.is_finished():
            break
        info = sc.job_info(job) if job else None
        if info is not None and not info.active:
            finalize(run, info)
            break
        if not hard and time.monotonic() > hard_at and job:
            hard = True
            try:
                scancel_checked(run, job)
            except SlurmError as exc:
                first += f"; {exc}"
        time.sleep(0.5)
    result = run.read_json(run.result_json)
    if result is None:
        return f"{first}; the job did not end within {timeout_s:g}s"
    return stopped_text(result) + ("; scancel of the whole job was needed" if hard else "")


class SlurmHandle(RunHandle):
    """A Slurm run: ``status`` shows Slurm's view beside the run's files. A submitted run (``batch``) is
    alive while its Slurm job is, and stops through Slurm; a run launched inside the user's allocation
    has its launcher here, whose SIGTERM is announced as a user's stop (not a preemption)."""

    def state(self) -> SlurmState | None:
        return SlurmState.load(self.run)

    @property
    def batch(self) -> bool:
        state = self.state()
        return state is not None and state.mode == "batch"

    def settle(self) -> None:
        if self.batch and not self.run.is_finished() and not supervisor_alive(self.run):
            finalize(
                self.run
            )  # the job is gone and nobody wrote its result (cancelled while pending, killed): now there is one

    def scheduler_status(self) -> dict[str, Any]:
        return {"slurm": slurm_status(self.run)} if self.state() is not None else {}

    def scheduler_lines(self, status: dict[str, Any]) -> list[str]:
        sl = status.get("slurm")
        if not isinstance(sl, dict):
            return []
        return [
            f"slurm job {sl.get('job_id') or '-'}: {sl.get('state', 'unknown')}"
            + (f" ({sl['reason']})" if sl.get("reason") and sl.get("reason") != "None" else "")
            + (f" on {sl['nodes']}" if sl.get("nodes") else "")
            + (f", {sl['time_left']} left" if sl.get("time_left") else "")
            + f"; preemptions {sl.get('preemptions', 0)}, time-outs {sl.get('timeouts', 0)}"
        ]

    def queued(self, status: dict[str, Any]) -> bool:
        sl = status.get("slurm")
        return isinstance(sl, dict) and sl.get("state") in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")

    def alive(self) -> bool:
        if self.batch:  # its supervisor runs in the allocation, often on another machine
            return supervisor_alive(self.run)
        return super().alive()

    def stop(self, timeout_s: float) -> str:
        if self.batch and not self.run.is_finished():  # its supervisor runs in the allocation: via Slurm
            self.check_owner()
            return stop_slurm(self.run, timeout_s=timeout_s)
        return super().stop(timeout_s)

    def before_signal(self) -> None:
        request_stop(self.run, "SIGTERM", "tfcluster stop")  # inside an allocation: a stop, not a preemption
