"""A launched job: run directory, connections, the attempt loop, hand-overs, the result.

``Job.run()`` returns a ``RunResult``; the CLI alone turns it into an exit code. What differs per
scheduler comes in as objects the job calls and never asks about: the ``Backend`` (how tasks start and
reach us) and the ``RunScheduling`` (its policy after each attempt, its records, a requeue). A test
drives the whole job with a fake backend.
"""

from __future__ import annotations

import os
import sys
import time

from ..backends import Backend
from ..backends.limits import nofile_warning, open_files
from ..core.result import AttemptResult, Failure, RunResult
from ..core.states import JobState, interrupted_state
from ..events import kinds as ev
from ..plan import Plan
from ..runs import RunDir, launcher_info, write_json_atomic, write_plan, write_private
from ..sinks.record import print_root_cause, record_result
from ..spec import LoadedSpec
from ..spec.redact import redacted_text
from ..supervise import Interrupt, Supervisor
from ..supervise.heap import settled_heap
from .options import LaunchOptions
from .outputs import RunOutputs
from .policy import Action, Decision
from .reshaping import Reshaper, connect_elastic
from .scheduling import RunScheduling
from .signals import signals_to
from .transfers import transfers_for


class Job:
    def __init__(
        self,
        loaded: LoadedSpec,
        plan: Plan,
        opts: LaunchOptions,
        backend: Backend,
        *,
        scheduling: RunScheduling | None = None,
        rundir: RunDir | None = None,  # an existing run directory to continue (a requeued Slurm job)
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.plan = plan
        self.opts = opts
        self.backend = backend
        self.scheduling = scheduling or RunScheduling()
        self.policy = self.scheduling.policy(self.spec)
        self.interrupt = Interrupt()
        self.rundir = rundir or RunDir.create(
            opts.run_dir or os.path.join("runs", plan.run_id), adopt=opts.adopt_run_dir
        )
        backend.bind_run(self.rundir.path)
        # raises the soft limit first: before any log opens
        self.nofile_warning = nofile_warning(len(plan.nodes), backend.fds_per_task)
        started = time.time()
        self.result = RunResult(
            job=plan.job,
            run_id=plan.run_id,
            run_dir=str(self.rundir.path),
            state=JobState.CONNECTING,
            started_ts=started,
            ended_ts=started,
        )
        self.out = RunOutputs(
            self.rundir,
            plan,
            live=opts.live,
            echo_logs=opts.echo_logs,
            max_log_bytes=self.spec.logs.max_bytes_per_task,
            all_output=opts.all_output,
            open_files=open_files(len(plan.nodes), backend.fds_per_task),
        )
        self.bus = self.out.bus
        if hasattr(backend, "bind_events"):  # a forged pod is reported as it is seen (test doubles may lack it)
            backend.bind_events(self.bus.emit)
        self.logs = self.out.logs
        self.transfers = transfers_for(self)
        self.reshaper = Reshaper(self.spec, plan, self.scheduling, self.rundir, self.bus)
        self.out.elastic = self.reshaper.status()
        self._notes_seen = 0

    # --- the whole job ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        """The run from its records to its result, and nothing of it left behind: write the run files,
        connect, run attempts until the policy says finish (or requeue), hand over each attempt's
        files, record the result (``job_finished`` + result.json), close every sink and connection.
        Failures are data in the result; only a bug raises."""
        continuing = self.scheduling.open(self)
        self._write_run_files(continuing)
        decision = Decision(Action.FINISH)
        try:
            with signals_to(self.interrupt, self.out.hangup, self.scheduling.signals):
                done = self.scheduling.completed_earlier(self)
                if done is not None:  # an earlier allocation's tasks completed the training: nothing to run
                    self.bus.emit(ev.TrainingCompleted(message=done))
                    self.result.become(JobState.SUCCEEDED)
                else:
                    self.out.start_live()
                    if self._connect():
                        with settled_heap():  # the plan and the sessions out of the collector's way
                            decision = self._attempts()
                if decision.final:
                    self.transfers.summarize()
                return self.end(decision)
        finally:
            self.out.close()
            self.backend.close()

    def _write_run_files(self, continuing: bool) -> None:
        rd = self.rundir
        if not continuing:
            write_private(rd.spec_yaml, redacted_text(self.loaded))
            write_plan(rd, self.plan)
        metrics = self.out.start_metrics(self.spec, self.opts.metrics_port)
        metrics.update(self.out.start_tensorboard(self.spec, self.opts.tensorboard_dir))
        write_json_atomic(rd.launcher_json, launcher_info(**metrics), durable=False)
        if not continuing:
            for w in self.loaded.warnings:
                self.bus.emit(ev.JobWarning(message=str(w)))
            for w in self.plan.warnings:
                self.bus.emit(ev.JobWarning(message=w))
        if self.nofile_warning:
            self.bus.emit(ev.JobWarning(message=self.nofile_warning))
        if not continuing:
            self.bus.emit(
                ev.JobStarted(
                    job=self.plan.job,
                    run_id=self.plan.run_id,
                    run_dir=str(rd.path),
                    tasks=len(self.plan.nodes),
                    attempt_limit=self.spec.restart.max_restarts + 1,
                )
            )
            for finding in self.opts.check_findings:
                self.bus.emit(finding)
        self.scheduling.opened(self)

    def _connect(self, attempt: int = 0) -> bool:
        """Reach every node (again before a restart: only those whose connection died); every
        unreachable one is reported, then the job ends — unless, at a restart of an elastic job, a
        spare takes its place or the job goes on with fewer workers (``reshaping.connect_elastic``)."""
        t0 = time.monotonic()
        self.plan, problems, ended = connect_elastic(self.backend, self.reshaper, self.plan, attempt)
        if ended is not None and ended.run_failure is not None:
            self.result.failures.append(ended.run_failure)
        if problems:
            for d in problems:
                self.bus.emit(ev.ConnectFailed(task=d.task, host=d.host, kind=d.code, message=d.message, hint=d.hint))
            text = "\n".join([f"cannot reach {len(problems)} host(s):"] + ["  " + d.render() for d in problems])
            first = problems[0]
            self.result.failures.append(Failure("connect", text, time.time(), first.task, first.host, attempt=attempt))
            self.result.become(JobState.CONNECT_FAILED)
            return False
        if attempt == 0 and self.backend.reaches_nodes:
            self.bus.emit(ev.Connected(hosts=len(self.plan.nodes), seconds=round(time.monotonic() - t0, 3)))
        if self.interrupt.count:
            self.result.become(interrupted_state(self.interrupt.signum or 2))
            return False
        return True

    def _attempts(self) -> Decision:
        """Attempts until the policy says otherwise; numbering goes on across a requeued run's allocations."""
        attempt = len(self.result.attempts)
        while True:
            self.result.become(JobState.STARTING)
            res, sup = self._attempt(attempt)
            decision = self.conclude(res, gpu_faults(sup))
            for note in list(self.backend.notes)[self._notes_seen :]:
                self.bus.emit(ev.JobWarning(message=f"{self.backend.name} teardown: {note}"))
            self._notes_seen = len(self.backend.notes)
            self.bus.emit(
                ev.AttemptFinished(
                    attempt=attempt,
                    state=res.state.value,
                    root_cause=res.root_cause.to_dict() if res.root_cause else None,
                )
            )
            self.transfers.after_attempt(sup, attempt, final=decision.final)
            if not decision.restarts:
                return decision
            attempt += 1
            if decision.reshape is not None:
                new = self.reshaper.apply(self.plan, decision.reshape, attempt)
                if new is None:
                    why = f"the {self.backend.name} scheduler cannot plan without host {decision.reshape.out.host}"
                    return Decision(Action.FINISH, run_failure=Failure("restart", why, time.time()))
                self.plan = new
            self.bus.emit(
                ev.Restart(
                    attempt=attempt,
                    max_attempts=self.spec.restart.max_restarts + 1,
                    reason=res.root_cause.message if res.root_cause else "failed",
                )
            )
            connected = self._connect(attempt)
            self.out.replan(self.plan, self.reshaper.status())
            if not connected:
                return Decision(Action.FINISH)
            self.transfers.before_restart(self.plan)

    def conclude(self, res: AttemptResult, gpu_faults: frozenset[str] = frozenset()) -> Decision:
        """The policy's decision after an attempt, and the attempt recorded as it says; the run restarts
        (on the same plan or, a host lost for good, a new one) or takes the attempt's state."""
        decision = self.policy.decide(res, self.result.attempts, self.interrupt, self.reshaper.members, gpu_faults)
        if decision.ended_by is not None:  # the allocation ended under it: a boundary, not an end
            res.become(JobState.REQUEUED)
            res.failures.insert(0, decision.ended_by)
        elif decision.completed is not None:  # its tasks completed their training: whatever the signal, it did
            res.become(JobState.SUCCEEDED)
            self.bus.emit(ev.TrainingCompleted(message=decision.completed))
        self.result.attempts.append(res)
        self.result.become(JobState.RESTARTING if decision.restarts else res.state)
        return decision

    def _attempt(self, attempt: int) -> tuple[AttemptResult, Supervisor]:
        self.logs.open_attempt(attempt, [(str(n.task), n.task.slug, n.host) for n in self.plan.nodes])
        sup = Supervisor(
            self.spec,
            self.plan,
            self.backend,
            attempt=attempt,
            bus=self.bus,
            logs=self.logs,
            heartbeats=self.out.heartbeats,
            interrupt=self.interrupt,
            preflight=self.opts.preflight,
            on_status=self.out.status,
            bound=self.opts.bound,
            figures=self.out.figures,
            evaluations=self.out.evaluations,
        )
        self.transfers.attempt_started(self.plan, attempt)  # the chief's backup copied off its host meanwhile
        return sup.run(), sup

    def stop_live(self) -> None:
        self.out.stop_live()

    # --- the end ---------------------------------------------------------------------------------

    def end(self, decision: Decision) -> RunResult:
        """One closing path: the scheduler settles its books, every line is on disk, then the result is
        recorded (the run ends) or the run is handed to the scheduler's next allocation (a requeue)."""
        result = self.result
        if decision.run_failure is not None:
            result.failures.append(decision.run_failure)
            result.become(JobState.FAILED)
        self.scheduling.settle(self, decision)
        ends = decision.action is not Action.REQUEUE
        if not ends:
            result.become(JobState.REQUEUED)
        elif result.failures and result.state == JobState.SUCCEEDED:
            result.become(JobState.FAILED)
        result.ended_ts = time.time()
        self.out.close_files()
        data = result.to_dict()
        if ends:
            extra = {"run_dir_error": self.out.guard.failure} if self.out.guard.failure is not None else {}
            try:
                data = record_result(self.rundir, result, self.bus, **extra)
            except OSError as exc:
                self.out.guard.fail(self.rundir.result_json, exc)
                print(f"tfcluster: the job {result.state.value}; result.json could not be written", file=sys.stderr)
        self.out.status(
            {
                "state": result.state.value,
                "attempt": len(result.attempts) - 1,
                "updated": time.time(),
                "tasks": data["tasks"],
                "finished": ends,
            }
        )
        rc = result.root_cause
        if ends and rc is not None and result.state != JobState.SUCCEEDED:
            print_root_cause(rc)
        self.scheduling.hand_off(self, decision)
        self.bus.close()
        return result


def gpu_faults(sup: Supervisor) -> frozenset[str]:
    """The tasks whose GPUs had a fault by DCGM's rules (``supervise.gpus``) when the attempt ended."""
    return frozenset(p.task for p in sup.monitor.gpus.judgement.problems if p.problem == "fault")


def launch(
    loaded: LoadedSpec, plan: Plan, opts: LaunchOptions, backend: Backend, scheduling: RunScheduling | None = None
) -> RunResult:
    """``tfcluster launch``: run the job to its end."""
    return Job(loaded, plan, opts, backend, scheduling=scheduling).run()
