"""One allocation's share of a Slurm run: what Slurm adds to the job's one attempt loop.

One supervisor runs per allocation: the batch script's (``tfcluster slurm-batch RUN``, submitted from
a login node) or ``tfcluster launch`` inside the user's own allocation. Each attempt is one srun step
(``step``). What Slurm adds:

* **The allocation ends** — USR2 ``signal_lead_s`` before the time limit (``--signal=B:USR2@…``), or
  SIGTERM when the job is preempted or requeued. The supervisor stops the tasks like on Ctrl-C:
  SIGTERM, ``job.stop_grace_s`` to save (Keras ``BackupAndRestore``, or a custom loop's SIGTERM
  handler / ``PreemptionCheckpointHandler``), then SIGKILL. ``SlurmPolicy`` records the attempt as
  ``requeued`` (a boundary, not an end), counted as a time-out or a preemption (each capped by
  ``slurm.max_requeues``), and the job is requeued: ``scontrol requeue`` after a time-limit warning
  (Slurm requeues preempted jobs itself), or a resubmission with ``--dependency=afterany`` where
  requeue is refused. The next allocation continues the run directory: attempt numbers, logs,
  events, result.json with every allocation's attempts; the training resumes from its backup.
* **A user's stop** (``tfcluster stop`` / Ctrl-C on the follower) leaves a request in the run directory
  before Slurm's SIGTERM arrives, so it ends the run instead of looking like a preemption; a plain
  ``scancel`` is recognised by the job state CANCELLED.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ...core.result import AttemptResult, Failure, TaskResult
from ...core.states import JobState, TaskState, interrupted_state
from ...events import kinds as ev
from ...job import Action, Decision, Members, RestartPolicy, RunScheduling
from ...job.policy import all_tasks_exited_0, every_task_completed, signal_name
from ...plan import Plan
from ...runs import RunDir
from ...spec import ClusterSpec
from ...supervise import Interrupt
from . import commands as sc
from .avoid import exclude_more
from .plan import fixed_roles, reshapable, slurm_plan
from .state import SlurmState, stop_requested
from .step import allocation_nodes

if TYPE_CHECKING:
    from ...job.context import RunContext

SIGNALS = {signal.SIGUSR2: "SIGUSR2", signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP"}
TIMEOUT_MARGIN_S = 60  # USR2 with less than signal_lead_s + this left: the time limit, not a preemption


class SlurmScheduling(RunScheduling):
    """``batch``: tfcluster's own batch job, which it requeues; else the user's allocation, which it does
    not (a later ``launch`` resumes from the backup)."""

    signals = (signal.SIGUSR2,)  # our --signal=B:USR2@lead, or a site that signals preemption with it

    def __init__(
        self, rundir: RunDir, state: SlurmState, spec: ClusterSpec, *, batch: bool, env: Mapping[str, str] = os.environ
    ) -> None:
        self.rundir = rundir
        self.spec = spec
        self.state = state
        self.batch = batch
        self.env = dict(env)
        self.job_id = sc.job_id_of(env)
        self.restart_count = int(env["SLURM_RESTART_COUNT"]) if env.get("SLURM_RESTART_COUNT", "").isdigit() else 0
        self.ending: str | None = None  # "timeout" | "preempted": this allocation ends, the run does not
        self.nodes = allocation_nodes(env)  # the allocation's nodes, in Slurm's order
        self.lost_nodes: list[str] = []  # out for good (reshapes): the next allocation avoids them

    @property
    def reshapes(self) -> bool:  # type: ignore[override]
        """A node lost for good leaves the run (issue 34): the next attempt is a new step on the nodes
        left, a spare node in its place (``slurm.spare_nodes``) or one fewer (``restart.min_workers``), with
        all its tasks (``slurm.tasks_per_node``)."""
        return reshapable(self.spec) and bool(self.nodes)

    def replan(self, plan: Plan, members: Members) -> Plan | None:
        """The plan of a reshaped attempt inside this allocation: ``members.hosts`` in the allocation's
        order (the order srun gives the step's ranks: the chief stays on the first node while it lives)."""
        if not self.reshapes or not set(members.hosts) <= set(self.nodes):
            return None
        self.lost_nodes = [e.host for e in members.excluded if e.host in self.nodes]
        order = {n: i for i, n in enumerate(self.nodes)}
        hosts = sorted(members.hosts, key=order.__getitem__)
        return slurm_plan(
            self.spec,
            run_id=plan.run_id,
            node_names=self.nodes,
            members=hosts,
            spares=members.spares,
            planned_workers=members.planned,
        )

    def fixed_hosts(self) -> str | None:
        return fixed_roles(self.spec)

    def policy(self, spec: ClusterSpec) -> SlurmPolicy:
        return SlurmPolicy(self, RestartPolicy(spec.restart.max_restarts))

    # --- across allocations ----------------------------------------------------------------------

    def open(self, job: RunContext) -> bool:
        continuing = bool(self.state.allocations)
        if continuing and isinstance(self.state.allocations[0].get("started_ts"), int | float):
            job.result.started_ts = self.state.allocations[0]["started_ts"]  # wall time of the whole run
        job.result.attempts = self._earlier_attempts(job)
        nodes = self.env.get("SLURM_JOB_NODELIST", "")
        if self.job_id.isdigit() and self.job_id not in self.state.job_ids:
            self.state.job_ids.append(self.job_id)  # the follower does not write slurm.json after sbatch
        self.state.allocations.append(
            {"job_id": self.job_id, "restart": self.restart_count, "nodes": nodes, "started_ts": time.time()}
        )
        self.state.save(self.rundir)
        return continuing

    def opened(self, job: RunContext) -> None:
        job.bus.emit(
            ev.SlurmAllocation(
                job_id=self.job_id,
                restart=self.restart_count,
                nodes=self.env.get("SLURM_JOB_NODELIST", ""),
                batch_host=self.env.get("SLURMD_NODENAME") or None,
                first_attempt=len(job.result.attempts),
                preemptions=self.state.preemptions,
                timeouts=self.state.timeouts,
            )
        )

    def completed_earlier(self, job: RunContext) -> str | None:
        """A requeued allocation whose every task already completed (exit 0) in the last one: finish at
        once, saying so, instead of training again from epoch 0 (the backup is gone with the training)."""
        last = job.result.attempts[-1] if job.result.attempts else None
        if last is None or not all_tasks_exited_0(last):  # its failure is the allocation's end, not the training's
            return None
        return (
            f"every task completed its training (exit 0) in attempt {last.attempt}, before Slurm job "
            f"{self.job_id}'s previous allocation ended: nothing is left to run, the run is done "
            "(not trained again)"
        )

    def _earlier_attempts(self, job: RunContext) -> list[AttemptResult]:
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
            msg = (
                f"allocation of Slurm job {last.get('job_id')} ended without its supervisor recording it "
                "(preempted, requeued, or its node failed); the next allocation resumes from the backup"
            )
            tasks = self._last_known_tasks(job, status, len(attempts))
            started = last.get("started_ts") if isinstance(last.get("started_ts"), int | float) else ended
            attempts.append(
                AttemptResult(
                    len(attempts),
                    JobState.REQUEUED,
                    started,
                    ended,
                    tasks,
                    [Failure("scheduler", msg, ended, attempt=len(attempts))],
                )
            )
            last.update(ended_ts=ended, end="lost")
            self.state.preemptions += 1
            self.state.attempts.append(attempts[-1].to_dict())
        return attempts

    def _last_known_tasks(self, job: RunContext, status: dict, attempt: int) -> dict[str, TaskResult]:
        """The tasks of an attempt whose supervisor died unrecorded: lost, unless its last status.json
        says they had all succeeded (exit 0: their training completed before the allocation went)."""
        known = (
            status.get("tasks") if status.get("attempt") == attempt and isinstance(status.get("tasks"), dict) else {}
        )
        done = bool(known) and all(isinstance(t, dict) and t.get("state") == "succeeded" for t in known.values())
        state = TaskState.SUCCEEDED if done and set(known) == {str(n.task) for n in job.plan.nodes} else TaskState.LOST
        return {
            str(n.task): TaskResult(str(n.task), n.host, state, exit_code=0 if state == TaskState.SUCCEEDED else None)
            for n in job.plan.nodes
        }

    # --- why the supervisor was signalled ---------------------------------------------------------

    def allocation_ending(self, interrupt: Interrupt) -> str | None:
        """Why the supervisor was signalled: the allocation ends ("timeout", "preempted") or not (a stop)."""
        first = interrupt.first
        if first is None or first not in (signal.SIGUSR2, signal.SIGTERM) or stop_requested(self.rundir):
            return None
        info = sc.job_info(self.job_id, self.env) if self.job_id else None
        if first == signal.SIGUSR2:
            if info is None or not info.known:
                return "timeout"
            left = sc.parse_duration(info.time_left)
            lead = self.spec.slurm.signal_lead_s if self.spec.slurm else 0
            return "timeout" if left is not None and left <= lead + TIMEOUT_MARGIN_S else "preempted"
        if info is not None and info.state == "CANCELLED":
            return None  # someone ran scancel: the run ends
        if not self.batch and (info is None or info.state in ("RUNNING", "UNKNOWN")):
            return None  # inside the user's allocation, which goes on: a kill of the launcher is a stop
        return "preempted"  # SIGTERM from Slurm: preemption, scontrol requeue, node going away

    def ending_message(self, ending: str, interrupt: Interrupt) -> str:
        sig = SIGNALS.get(interrupt.first or 0, "a signal")
        if ending == "timeout":
            return f"Slurm job {self.job_id} reaches its time limit ({sig}): the tasks were asked to save"
        return f"Slurm job {self.job_id} was preempted or requeued ({sig}): the tasks were asked to save"

    # --- the end of this allocation ---------------------------------------------------------------

    def settle(self, job: RunContext, decision: Decision) -> None:
        alloc = self.state.allocations[-1]
        alloc.update(ended_ts=time.time(), end=self.ending or "ended")
        self.state.attempts = [a.to_dict() for a in job.result.attempts]
        if self.ending == "timeout":
            self.state.timeouts += 1
        elif self.ending is not None:
            self.state.preemptions += 1
        stop = stop_requested(self.rundir)
        if stop == "SIGINT" and job.result.state == JobState.INTERRUPTED_SIGTERM:
            job.result.become(interrupted_state(signal.SIGINT))  # Ctrl-C on the follower, delivered as scancel
        self.state.save(self.rundir)

    def hand_off(self, job: RunContext, decision: Decision) -> None:
        """Requeue: everything is on disk; hand the job back to Slurm (which ends this allocation, and us)."""
        if decision.action is not Action.REQUEUE:
            return
        self.state.requeues += 1
        job.backend.close()  # the step is down before we give up the allocation
        ours = job.interrupt.first == signal.SIGUSR2  # a warning: Slurm will not requeue the job, we do
        job.bus.emit(
            ev.Requeued(
                reason=self.ending,
                job_id=self.job_id,
                how="scontrol requeue" if ours else "by Slurm",
                preemptions=self.state.preemptions,
                timeouts=self.state.timeouts,
                next_attempt=len(job.result.attempts),
            )
        )
        self.state.save(self.rundir)
        if ours:
            try:
                sc.requeue(self.job_id)  # Slurm now SIGTERMs us: everything is on disk already
            except sc.SlurmError as exc:
                new_job = self._resubmit(job)
                job.bus.emit(
                    ev.JobWarning(message=f"scontrol requeue refused ({exc}); resubmitted as Slurm job {new_job}")
                )
                self.state.save(self.rundir)
            else:
                self._avoid_lost_nodes(job)

    def _avoid_lost_nodes(self, job: RunContext) -> None:
        """The requeued (now pending) job leaves the nodes lost for good in this allocation out of its
        next one: ``scontrol update JobId=J ExcNodeList=...`` (22.05 on: pending jobs only)."""
        if not self.lost_nodes:
            return
        try:
            exclude_more(self.job_id, self.lost_nodes, self.env)
        except sc.SlurmError as exc:
            job.bus.emit(ev.JobWarning(message=f"the requeued job may get {','.join(self.lost_nodes)} again: {exc}"))

    def _exclude(self) -> list[str]:
        return [f"--exclude={','.join(self.lost_nodes)}"] if self.lost_nodes else []

    def _resubmit(self, job: RunContext) -> str | None:
        """Where requeue is not allowed: the same batch job again, after this one."""
        try:
            argv = json.loads((self.rundir.slurm_dir / "sbatch.json").read_text())
            if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv[:1] == ["sbatch"]):
                raise ValueError("not an sbatch command line")
            new = sc.submit(
                [*argv[:-1], f"--dependency=afterany:{self.job_id}", *self._exclude(), argv[-1]]
            )  # RUN/slurm/private-spec.json
        except (OSError, ValueError) as exc:
            job.bus.emit(ev.JobWarning(message=f"could not resubmit the job: {exc}"))
            return None
        self.state.job_ids.append(new)
        return new


class SlurmPolicy:
    """The spec's restart budget within an allocation; an allocation that ends under an attempt is a
    requeue (capped by ``slurm.max_requeues``, only for tfcluster's own batch job), never a restart."""

    def __init__(self, scheduling: SlurmScheduling, restarts: RestartPolicy) -> None:
        self.scheduling = scheduling
        self.restarts = restarts

    def decide(
        self,
        attempt: AttemptResult,
        earlier: Sequence[AttemptResult],
        interrupt: Interrupt,
        members: Members | None = None,
        gpu_faults: frozenset[str] = frozenset(),
    ) -> Decision:
        s = self.scheduling
        # Every task completed its training (exit 0), even during the save grace: the run is done, whatever
        # the signal said — a requeue would start the training over (BackupAndRestore removed its backup).
        if every_task_completed(attempt) and attempt.state != JobState.SUCCEEDED:
            s.ending = None
            return Decision(
                Action.FINISH,
                completed=(
                    f"every task exited 0 — it completed its training — while Slurm job {s.job_id} was ending "
                    f"({signal_name(interrupt.first)}: preemption, requeue or time limit): the run is done, not requeued"
                ),
            )
        ending = None if attempt.state == JobState.SUCCEEDED else s.allocation_ending(interrupt)
        s.ending = ending
        if ending is None:
            return self.restarts.decide(attempt, earlier, interrupt, members, gpu_faults)
        ended_by = Failure("scheduler", s.ending_message(ending, interrupt), time.time(), attempt=attempt.attempt)
        slurm = s.spec.slurm
        cap = slurm.max_requeues if slurm else 0
        count = 1 + (s.state.timeouts if ending == "timeout" else s.state.preemptions)
        requeue = bool(slurm and slurm.requeue)
        if s.batch and requeue and count <= cap:
            return Decision(Action.REQUEUE, ended_by=ended_by)
        why = (
            f"{count} {'time-outs' if ending == 'timeout' else 'preemptions'}, more than slurm.max_requeues ({cap})"
            if s.batch and requeue
            else "slurm.requeue is false"
            if s.batch
            else "inside your own allocation tfcluster does not requeue: launch again to resume from the backup"
        )
        failure = Failure("scheduler", f"{ended_by.message}; not requeued: {why}", time.time())
        return Decision(Action.FINISH, ended_by=ended_by, run_failure=failure)
