"""A Slurm job: the same Job (attempts, restarts, result) inside an allocation, across requeues.

One ``SlurmJob`` runs per allocation: the batch script's supervisor (``tfcluster slurm-batch RUN``,
submitted from a login node) or ``tfcluster launch`` inside the user's own allocation. Each attempt is
one srun step (``backends.slurm``). What Slurm adds:

* **The allocation ends** — USR2 ``signal_lead_s`` before the time limit (``--signal=B:USR2@…``), or
  SIGTERM when the job is preempted or requeued. The supervisor stops the tasks like on Ctrl-C:
  SIGTERM, ``job.stop_grace_s`` to save (Keras ``BackupAndRestore``, or a custom loop's SIGTERM
  handler / ``PreemptionCheckpointHandler``), then SIGKILL. The attempt is recorded as ``requeued``
  (a boundary, not an end), counted as a time-out or a preemption (each capped by
  ``slurm.max_requeues``), and the job is requeued: ``scontrol requeue`` after a time-limit warning
  (Slurm requeues preempted jobs itself), or a resubmission with ``--dependency=afterany`` where
  requeue is refused. The next allocation's supervisor continues the run directory: attempt numbers,
  logs, events, result.json with every allocation's attempts; the training resumes from its backup.
* **A user's stop** (``tfcluster stop`` / Ctrl-C on the follower) leaves a request in the run directory
  before Slurm's SIGTERM arrives, so it ends the run instead of looking like a preemption; a plain
  ``scancel`` is recognised by the job state CANCELLED.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker_entry.protocol.env import Env

from ..backends.slurm import SlurmError, SlurmStepBackend, allocation_nodes
from ..backends.slurm import commands as sc
from ..core.result import AttemptResult, Failure, RunResult, TaskResult
from ..core.states import JobState, TaskState, interrupted_state
from ..plan import Plan
from ..plan.slurm import slurm_plan
from ..runs import RunDir, write_json_atomic
from ..runs.slurm_state import SlurmState, stop_requested
from ..spec import LoadedSpec, load_spec, load_spec_text
from ..supervise import Interrupt
from .job import Job, LaunchOptions

SIGNALS = {signal.SIGUSR2: "SIGUSR2", signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP"}
TIMEOUT_MARGIN_S = 60  # USR2 with less than signal_lead_s + this left: the time limit, not a preemption


class FirstSignal(Interrupt):
    """An Interrupt that remembers the first signal (USR2 then Slurm's SIGTERM is still a time-out)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: int | None = None

    def trigger(self, signum: int) -> None:
        if self.first is None:
            self.first = signum
        super().trigger(signum)


class SlurmJob(Job):
    """One allocation's share of a Slurm run (``batch``: tfcluster's own batch job, which it requeues)."""

    def __init__(
        self,
        loaded: LoadedSpec,
        plan: Plan,
        opts: LaunchOptions,
        *,
        rundir: RunDir,
        state: SlurmState,
        batch: bool,
        env: Mapping[str, str] = os.environ,
        backend: Any = None,
    ) -> None:
        backend = backend or SlurmStepBackend(loaded.spec, plan, env=env)  # Job binds it to the run directory
        super().__init__(loaded, plan, opts, backend=backend, rundir=rundir)
        self.interrupt = FirstSignal()
        self.state = state
        self.batch = batch
        self.env = dict(env)
        self.job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        self.restart_count = int(env["SLURM_RESTART_COUNT"]) if env.get("SLURM_RESTART_COUNT", "").isdigit() else 0
        self.ending: str | None = None  # "timeout" | "preempted": this allocation ends, the run does not
        self.spec_payload: str | None = None  # for a resubmission: the spec travels in the job's environment
        self.continuing = bool(state.allocations)
        if self.continuing and isinstance(state.allocations[0].get("started_ts"), int | float):
            self.result.started_ts = state.allocations[0]["started_ts"]  # wall time of the whole run
        self.result.attempts = self._previous_attempts()
        self.first_attempt = len(self.result.attempts)

    # --- across allocations ---------------------------------------------------------------------

    def _previous_attempts(self) -> list[AttemptResult]:
        attempts = []
        for d in self.state.attempts:
            try:
                attempts.append(AttemptResult.from_dict(d))
            except (KeyError, TypeError, ValueError):
                continue  # a damaged record loses that attempt's details, not the run
        last = self.state.allocations[-1] if self.state.allocations else None
        if last is not None and "ended_ts" not in last:  # its supervisor died with the allocation (SIGKILL)
            status = self.rundir.read_json(self.rundir.status_json) or {}
            ended = status.get("updated") if isinstance(status.get("updated"), int | float) else time.time()
            msg = (f"allocation of Slurm job {last.get('job_id')} ended without its supervisor recording it "
                   "(preempted, requeued, or its node failed); the next allocation resumes from the backup")  # fmt: skip
            tasks = {str(n.task): TaskResult(str(n.task), n.host, TaskState.LOST) for n in self.plan.nodes}
            started = last.get("started_ts") if isinstance(last.get("started_ts"), int | float) else ended
            attempts.append(AttemptResult(len(attempts), JobState.REQUEUED, started, ended, tasks,
                                          [Failure("scheduler", msg, ended, attempt=len(attempts))]))  # fmt: skip
            last.update(ended_ts=ended, end="lost")
            self.state.preemptions += 1
            self.state.attempts.append(attempts[-1].to_dict())
        return attempts

    def _write_run_files(self) -> None:
        nodes = self.env.get("SLURM_JOB_NODELIST", "")
        if self.job_id.isdigit() and self.job_id not in self.state.job_ids:
            self.state.job_ids.append(self.job_id)  # the follower does not write slurm.json after sbatch
        self.state.allocations.append(
            {"job_id": self.job_id, "restart": self.restart_count, "nodes": nodes, "started_ts": time.time()}
        )
        self.state.save(self.rundir)
        if self.continuing:
            write_json_atomic(self.rundir.launcher_json, _launcher(), durable=False)
        else:
            super()._write_run_files()
        self.bus.emit(
            "slurm_allocation",
            job_id=self.job_id,
            restart=self.restart_count,
            nodes=nodes,
            batch_host=self.env.get("SLURMD_NODENAME") or None,
            first_attempt=self.first_attempt,
            preemptions=self.state.preemptions,
            timeouts=self.state.timeouts,
        )

    def _connect(self, nodes: Any = None, attempt: int = 0) -> bool:
        """Nothing to connect to: the tasks dial us once srun starts them."""
        if self.interrupt.count:
            self.result.state = interrupted_state(self.interrupt.signum or signal.SIGTERM)
            return False
        return True

    # --- attempts --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        previous = signal.signal(signal.SIGUSR2, lambda signum, frame: self.interrupt.trigger(signum))
        try:
            return super().run()
        finally:
            signal.signal(signal.SIGUSR2, previous)

    def _attempts(self) -> None:
        """Like Job's: restarts after failures within the allocation; an ending allocation stops here.
        Each attempt hands over on the tasks' own channels (logs); the run's last one also brings the
        chief's checkpoint — not one that ends with its allocation: the run goes on in the next."""
        attempt = self.first_attempt
        restarts = sum(1 for a in self.result.attempts if a.state == JobState.FAILED)
        while True:
            self.result.state = JobState.STARTING
            res, sup = self._attempt(attempt)
            # Every task finished during the save grace: the run is done, whatever the signal said.
            self.ending = None if res.state == JobState.SUCCEEDED else self._allocation_ending()
            if self.ending is not None:
                res.state = JobState.REQUEUED
                res.failures.insert(0, Failure("scheduler", self._ending_message(), time.time(), attempt=attempt))
            self.result.attempts.append(res)
            self.result.state = res.state
            for note in getattr(self.backend, "notes", []):
                self.bus.emit("warning", message=f"slurm teardown: {note}")
            self.bus.emit(
                "attempt_finished",
                attempt=attempt,
                state=res.state.value,
                root_cause=res.root_cause.to_dict() if res.root_cause else None,
            )
            restart = res.state == JobState.FAILED and restarts < self.spec.restart.max_restarts
            restart = restart and not self.interrupt.count and self.ending is None
            self._hand_over(sup, attempt, final=not restart and self.ending is None)
            if not restart:
                return
            restarts += 1
            attempt += 1
            self.result.state = JobState.RESTARTING
            self.bus.emit(
                "restart",
                attempt=attempt,
                max_attempts=self.spec.restart.max_restarts + 1,
                reason=res.root_cause.message if res.root_cause else "failed",
            )

    def _summarize_gather(self) -> None:
        if self.ending is None:  # an allocation that ends mid-run has nothing to summarize yet
            super()._summarize_gather()

    def _allocation_ending(self) -> str | None:
        """Why the supervisor was signalled: the allocation ends (time-out, preemption) or not (a stop)."""
        first = self.interrupt.first
        if first is None or first not in (signal.SIGUSR2, signal.SIGTERM) or stop_requested(self.rundir):
            return None
        info = sc.job_info(self.job_id, self.env) if self.job_id else None
        if first == signal.SIGUSR2:  # our --signal=B:USR2@lead, or a site that signals preemption with it
            if info is None or not info.known:
                return "timeout"
            left = parse_slurm_duration(info.time_left)
            lead = self.spec.slurm.signal_lead_s if self.spec.slurm else 0
            return "timeout" if left is not None and left <= lead + TIMEOUT_MARGIN_S else "preempted"
        if info is not None and info.state == "CANCELLED":
            return None  # someone ran scancel: the run ends
        if not self.batch and (info is None or info.state in ("RUNNING", "UNKNOWN")):
            return None  # inside the user's allocation, which goes on: a kill of the launcher is a stop
        return "preempted"  # SIGTERM from Slurm: preemption, scontrol requeue, node going away
    def _ending_message(self) -> str:
        sig = SIGNALS.get(self.interrupt.first or 0, "a signal")
        if self.ending == "timeout":
            return f"Slurm job {self.job_id} reaches its time limit ({sig}): the tasks were asked to save"
        return f"Slurm job {self.job_id} was preempted or requeued ({sig}): the tasks were asked to save"

    # --- the end of this allocation --------------------------------------------------------------

    def _finish(self) -> RunResult:
        alloc = self.state.allocations[-1]
        alloc.update(ended_ts=time.time(), end=self.ending or "ended")
        self.state.attempts = [a.to_dict() for a in self.result.attempts]
        if self.ending is not None:
            if self.ending == "timeout":
                self.state.timeouts += 1
            else:
                self.state.preemptions += 1
            cap = self.spec.slurm.max_requeues if self.spec.slurm else 0
            count = self.state.timeouts if self.ending == "timeout" else self.state.preemptions
            if self.batch and self.spec.slurm and self.spec.slurm.requeue and count <= cap:
                return self._requeue()
            why = (f"{count} {'time-outs' if self.ending == 'timeout' else 'preemptions'}, more than "
                   f"slurm.max_requeues ({cap})" if self.batch and self.spec.slurm and self.spec.slurm.requeue
                   else "slurm.requeue is false" if self.batch
                   else "inside your own allocation tfcluster does not requeue: launch again to resume from the backup")  # fmt: skip
            self.result.failures.append(Failure("scheduler", f"{self._ending_message()}; not requeued: {why}", time.time()))
            self.result.state = JobState.FAILED
        stop = stop_requested(self.rundir)
        if stop == "SIGINT" and self.result.state == JobState.INTERRUPTED_SIGTERM:
            self.result.state = interrupted_state(signal.SIGINT)  # Ctrl-C on the follower, delivered as scancel
        self.state.save(self.rundir)
        return super()._finish()

    def _requeue(self) -> RunResult:
        """Record everything, then hand the job back to Slurm (which ends this allocation, and us)."""
        self.state.requeues += 1
        self.result.state = JobState.REQUEUED
        self.backend.close()  # the step is down before we give up the allocation
        ours = self.interrupt.first == signal.SIGUSR2  # a warning: Slurm will not requeue the job, we do
        self.bus.emit(
            "requeued",
            reason=self.ending,
            job_id=self.job_id,
            how="scontrol requeue" if ours else "by Slurm",
            preemptions=self.state.preemptions,
            timeouts=self.state.timeouts,
            next_attempt=len(self.result.attempts),
        )
        self.state.save(self.rundir)
        self.logs.close()
        self.heartbeats.close()
        self.status({"state": JobState.REQUEUED.value, "attempt": len(self.result.attempts) - 1,
                     "updated": time.time(), "tasks": self.result.to_dict()["tasks"], "finished": False})  # fmt: skip
        if ours:
            try:
                sc.requeue(self.job_id)  # Slurm now SIGTERMs us: everything is on disk already
            except SlurmError as exc:
                new_job = self._resubmit()
                self.bus.emit("warning", message=f"scontrol requeue refused ({exc}); resubmitted as Slurm job {new_job}")
                self.state.save(self.rundir)
        self.bus.close()
        return self.result

    def _resubmit(self) -> str | None:
        """Where requeue is not allowed: the same batch job again, after this one."""
        try:
            argv = json.loads((self.rundir.path / "slurm" / "sbatch.json").read_text())
            if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv[:1] == ["sbatch"]):
                raise ValueError("not an sbatch command line")
            env = {**os.environ, Env.SLURM_SPEC: self.spec_payload} if self.spec_payload else None
            job = sc.submit([*argv[:-1], f"--dependency=afterany:{self.job_id}", argv[-1]], env=env)
        except (OSError, ValueError) as exc:
            self.bus.emit("warning", message=f"could not resubmit the job: {exc}")
            return None
        self.state.job_ids.append(job)
        return job


def parse_slurm_duration(text: str) -> float | None:
    """squeue's %L / %M: ``SS``, ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``; None for UNLIMITED/INVALID/garbage."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not rest or len(parts) > 3 or not all(p.isdigit() and len(p) <= 6 for p in parts) or (days and not days.isdigit()):
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return secs + (int(days) * 86400 if days else 0)


def _launcher() -> dict[str, Any]:
    from .job import _launcher_info

    return _launcher_info()


def run_batch(run_dir: str, env: Mapping[str, str] = os.environ) -> RunResult | None:
    """``tfcluster slurm-batch RUN``: the supervisor of one allocation of a submitted run."""
    rundir = RunDir(Path(run_dir))
    state = SlurmState.load(rundir)
    if state is None:
        raise FileNotFoundError(f"{run_dir}: no slurm.json: not a run submitted by tfcluster (or not on a shared filesystem)")
    if rundir.is_finished():
        print(f"tfcluster: run {rundir.path} already finished; nothing to do", flush=True)
        return None
    payload = os.environ.pop(Env.SLURM_SPEC, None) if env is os.environ else env.get(Env.SLURM_SPEC)
    loaded = spec_from_payload(payload) if payload else None
    if loaded is None:  # not submitted by this version: the run directory's (redacted) copy
        print(f"tfcluster: warning: no {Env.SLURM_SPEC} in the job's environment; running RUN/spec.yaml", flush=True)
        loaded = load_spec(rundir.spec_yaml)
    plan = slurm_plan(loaded.spec, run_id=state.run_id, node_names=allocation_nodes(env))
    opts = LaunchOptions(run_dir=str(rundir.path), gather=state.gather, live=False, echo_logs=False)
    job = SlurmJob(loaded, plan, opts, rundir=rundir, state=state, batch=True, env=env)
    job.spec_payload = payload
    return job.run()


def spec_from_payload(payload: str) -> LoadedSpec | None:
    """The spec ``slurm_submit.spec_payload`` packed (validated again, like any spec file); None if garbled."""
    try:
        data = json.loads(base64.b64decode(payload.encode("ascii"), validate=True))
    except (ValueError, UnicodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str) or not isinstance(data.get("path"), str):
        return None
    loaded = load_spec_text(data["text"], data["path"])
    command = data.get("command")
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        job = loaded.spec.job.model_copy(update={"command": command})
        loaded = LoadedSpec(spec=loaded.spec.model_copy(update={"job": job}), path=loaded.path, text=loaded.text,
                            warnings=loaded.warnings)  # fmt: skip
    return loaded


def launch_in_allocation(loaded: LoadedSpec, plan: Plan, opts: LaunchOptions, env: Mapping[str, str] = os.environ) -> RunResult:
    """``tfcluster launch`` with SLURM_JOB_ID set: one srun step per attempt in this allocation."""
    plan = slurm_plan(loaded.spec, run_id=plan.run_id, node_names=allocation_nodes(env))
    rundir = RunDir.create(opts.run_dir or os.path.join("runs", plan.run_id), adopt=opts.adopt_run_dir)
    state = SlurmState(run_id=plan.run_id, mode="allocation", job_ids=[env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""])
    state.job_ids = [j for j in state.job_ids if j.isdigit()]
    opts = dataclasses.replace(opts, run_dir=str(rundir.path))
    return SlurmJob(loaded, plan, opts, rundir=rundir, state=state, batch=False, env=env).run()
