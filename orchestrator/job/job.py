"""A launched job: run directory, connections, attempts and restarts, backup sync, gather, result.

``Job.run()`` returns a ``RunResult``; the CLI alone turns it into an exit code. The backend is a
parameter (the SSH fleet by default), so a test can drive the whole job with a fake one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..backends import Backend
from ..core.redact import redact_argv
from ..core.result import AttemptResult, Failure, RunResult
from ..core.states import JobState, interrupted_state
from ..events import EventBus
from ..plan import Plan
from ..runs import RunDir, write_json_atomic
from ..sinks import ConsoleSink, EventFileSink, HeartbeatFile, LogRouter, WriteGuard, use_color
from ..sinks.status import StatusWriter
from ..spec import LoadedSpec
from ..spec.redact import redacted_text
from ..supervise import Interrupt, Supervisor
from ..supervise.bound import RunBound
from ..supervise.figures import Figures
from .signals import Hangup, signals_to


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str | None = None
    preflight: bool = True
    gather: bool = True
    live: bool = True
    echo_logs: bool = True
    adopt_run_dir: bool = False  # --detach: the run directory was created for us (holds launcher.log)
    metrics_port: int | None = None  # overrides the spec's metrics.port
    bound: RunBound | None = None  # stop cleanly (a success) after N steps or D seconds of training


class _ProfileTee:
    """heartbeats.jsonl, and the latest profile record of each task to the metrics."""

    def __init__(self, sink: Any, metrics: Any) -> None:
        self.sink = sink
        self.metrics = metrics

    def write(self, task: str, record: dict[str, Any]) -> None:
        self.sink.write(task, record)
        if record.get("kind") == "profile":
            self.metrics.profile(task, record)

    def close(self) -> None:
        self.sink.close()


class Gathered:
    """What the hand-overs of every attempt brought back (result.json's ``gather``)."""

    def __init__(self, rundir: RunDir) -> None:
        from ..transfer.state import GatherState, Totals

        self.state = GatherState.load(rundir.path / "gather-state.json")
        self.totals = Totals()
        self.logs: dict[str, str] = {}
        self.checkpoints: dict[str, Any] | None = None

    def add(self, done: Any) -> None:
        self.totals.merge(done.totals)
        self.logs.update(done.logs)
        self.checkpoints = done.checkpoints or self.checkpoints


class Job:
    def __init__(
        self,
        loaded: LoadedSpec,
        plan: Plan,
        opts: LaunchOptions,
        backend: Backend | None = None,
        rundir: RunDir | None = None,  # an existing run directory to continue (a requeued Slurm job)
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.plan = plan
        self.opts = opts
        if backend is None:
            from .backends import backend_for

            backend = backend_for(self.spec, plan)
        self.backend = backend
        self.interrupt = Interrupt()
        self.rundir = rundir or RunDir.create(opts.run_dir or os.path.join("runs", plan.run_id), adopt=opts.adopt_run_dir)
        backend.bind_run(self.rundir.path)
        started = time.time()
        self.result = RunResult(
            job=plan.job,
            run_id=plan.run_id,
            run_dir=str(self.rundir.path),
            state=JobState.CONNECTING,
            started_ts=started,
            ended_ts=started,
        )
        self.live: Any = None
        if opts.live and opts.echo_logs and use_color(sys.stdout) and sys.stdout.isatty():
            from ..sinks.live import LiveTable

            self.live = LiveTable(plan)
        self.guard = WriteGuard()  # the run directory may fill up mid-run: one warning, the job goes on
        self.bus = EventBus([EventFileSink(self.rundir.events_jsonl, self.guard), ConsoleSink()])
        self.logs = LogRouter(self.rundir, echo=opts.echo_logs, guard=self.guard)
        if self.live is not None:
            self.logs.console_hook = self.live.print_log
        self.heartbeats = HeartbeatFile(self.rundir.heartbeats_jsonl, self.guard)
        self.figures = Figures.replay(self.rundir.heartbeats_jsonl)  # a continued run's records count too
        self.status_file = StatusWriter(self.rundir, plan.job, plan.run_id, self.live, self.figures)
        self.metrics: Any = None
        self.metrics_server: Any = None
        self.hangup = Hangup(self.rundir.launcher_log)
        self.gathered = Gathered(self.rundir)

    # --- the whole job ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        self._write_run_files()
        try:
            with signals_to(self.interrupt, self.hangup):
                if self.live is not None:
                    self.live.start()
                if self._connect():
                    self._attempts()
                if self.opts.gather and self.backend.transfers and self.result.attempts:
                    self._summarize_gather()
                return self._finish()
        finally:
            if self.live is not None:
                self.live.stop()
            if self.metrics_server is not None:
                self.metrics_server.close()
            self.backend.close()

    def _start_metrics(self) -> dict[str, Any]:
        """Serve Prometheus metrics while the job runs (when asked); what launcher.json records."""
        port = self.opts.metrics_port if self.opts.metrics_port is not None else self.spec.metrics.port
        if port is None:
            return {}
        from ..sinks.metrics import JobMetrics, MetricsServer

        self.metrics = JobMetrics(self.plan.job, self.plan.run_id)
        try:
            self.metrics_server = MetricsServer(self.metrics, self.spec.metrics.address, port)
        except OSError as exc:
            self.metrics = None
            self.bus.emit("warning", message=f"cannot serve metrics on {self.spec.metrics.address}:{port}: {exc}")
            return {}
        self.bus.subscribe(self.metrics)
        self.heartbeats = _ProfileTee(self.heartbeats, self.metrics)
        self.bus.emit("metrics", url=self.metrics_server.url)
        return {"metrics_url": self.metrics_server.url}

    def _write_run_files(self) -> None:
        rd = self.rundir
        fd = os.open(rd.spec_yaml, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(redacted_text(self.loaded))
        write_json_atomic(rd.plan_json, self.plan.to_dict(), durable=False)
        write_json_atomic(rd.launcher_json, {**_launcher_info(), **self._start_metrics()}, durable=False)
        for w in self.loaded.warnings:
            self.bus.emit("warning", message=str(w))
        for w in self.plan.warnings:
            self.bus.emit("warning", message=w)
        self.bus.emit(
            "job_started",
            job=self.plan.job,
            run_id=self.plan.run_id,
            run_dir=str(rd.path),
            tasks=len(self.plan.nodes),
            attempt_limit=self.spec.restart.max_restarts + 1,
        )

    def _connect(self, nodes: Any = None, attempt: int = 0) -> bool:
        """Reach every node (or ``nodes``); every unreachable one is reported, then the job ends."""
        t0 = time.monotonic()
        problems = self.backend.connect(nodes if nodes is not None else self.plan.nodes)
        if problems:
            for d in problems:
                self.bus.emit("connect_failed", task=d.task, host=d.host, kind=d.code, message=d.message, hint=d.hint)
            text = "\n".join([f"cannot reach {len(problems)} host(s):"] + ["  " + d.render() for d in problems])
            first = problems[0]
            self.result.failures.append(Failure("connect", text, time.time(), first.task, first.host, attempt=attempt))
            self.result.state = JobState.CONNECT_FAILED
            return False
        if nodes is None:
            self.bus.emit("connected", hosts=len(self.plan.nodes), seconds=round(time.monotonic() - t0, 3))
        if self.interrupt.count:
            self.result.state = interrupted_state(self.interrupt.signum or 2)
            return False
        return True

    def _attempts(self) -> None:
        """Run attempts until one does not fail, the restart budget is spent, or we are interrupted."""
        attempt = 0
        while True:
            self.result.state = JobState.STARTING
            res, sup = self._attempt(attempt)
            self.result.attempts.append(res)
            self.result.state = res.state
            self.bus.emit(
                "attempt_finished",
                attempt=attempt,
                state=res.state.value,
                root_cause=res.root_cause.to_dict() if res.root_cause else None,
            )
            restart = res.state == JobState.FAILED and attempt < self.spec.restart.max_restarts
            restart = restart and not self.interrupt.count
            if self.backend.transfers:
                self._hand_over(sup, attempt, final=not restart)
            else:  # nothing to fetch from the nodes (Kubernetes: every line came through the API)
                for s in sup.sessions.values():
                    s.close()
            if not restart:
                return
            attempt += 1
            self.result.state = JobState.RESTARTING
            self.bus.emit(
                "restart",
                attempt=attempt,
                max_attempts=self.spec.restart.max_restarts + 1,
                reason=res.root_cause.message if res.root_cause else "failed",
            )
            if not self._connect(self.plan.nodes, attempt):  # reconnects only the hosts whose connection died
                return
            if self.backend.transfers:
                self._sync_backup()

    def _attempt(self, attempt: int) -> tuple[AttemptResult, Supervisor]:
        self.logs.open_attempt(attempt, [(str(n.task), n.task.slug, n.host) for n in self.plan.nodes])
        sup = Supervisor(
            self.spec,
            self.plan,
            self.backend,
            attempt=attempt,
            bus=self.bus,
            logs=self.logs,
            heartbeats=self.heartbeats,
            interrupt=self.interrupt,
            preflight=self.opts.preflight,
            on_status=self.status,
            bound=self.opts.bound,
            figures=self.figures,
        )
        return sup.run(), sup

    def status(self, status: dict[str, Any]) -> None:
        """Every second, from the supervisor's loop: the live status, and a hangup acted on."""
        if self.hangup.count > self.hangup.handled:
            self.hangup.handled = self.hangup.count
            if self.live is not None:
                self.live.stop()
                self.live = self.status_file.live = self.logs.console_hook = None
            self.logs.color = False
            for sink in self.bus.sinks:
                if isinstance(sink, ConsoleSink):
                    sink.color = False
            self.bus.emit(
                "detached",
                message=f"the terminal went away (SIGHUP): the job goes on; output in {self.hangup.log}",
                log=str(self.hangup.log),
            )
        if self.metrics is not None:
            self.metrics.update(status)
        self.status_file(status)

    def _hand_over(self, sup: Supervisor, attempt: int, *, final: bool) -> None:
        """Over the tasks' own channels: complete this attempt's logs, and after the final attempt
        bring the chief's checkpoint (Ctrl-C now: stop after the current file; twice: abort)."""
        from ..transfer.handover import hand_over

        fetch = self.opts.gather
        if final:
            if self.live is not None:
                self.live.stop()  # the gather's progress bar and the summary print below it
            if fetch:
                self.bus.emit("gather_started", attempts=attempt + 1)
        self.logs.flush()
        base = self.interrupt.count
        done = hand_over(
            list(sup.sessions.values()),
            self.rundir,
            self.bus,
            self.gathered.state,
            self.logs.write,
            attempt=attempt,
            fetch=fetch,
            checkpoint=final and fetch and self.spec.checkpoint.gather,
            stop=lambda: self.interrupt.count - base,
        )
        self.gathered.add(done)
        if done.totals.interrupted:
            self.result.gather_interrupted = self.interrupt.signum

    def _sync_backup(self) -> None:
        """Every task must restore from the chief's backup; copy it where storage is not shared."""
        from ..transfer import sync_backup

        try:
            sync_backup(self.plan, self._connections(), self.bus)
        except Exception as exc:  # the restart still happens; Keras then starts those tasks from scratch
            self.bus.emit("warning", message=f"could not copy the chief's backup to the other tasks: {exc}")

    def _connections(self) -> dict[str, Any]:
        found = {str(n.task): self.backend.connection(str(n.task)) for n in self.plan.nodes}
        return {t: c for t, c in found.items() if c is not None}

    def _summarize_gather(self) -> None:
        from ..transfer.gather import summarize

        g = self.gathered
        with contextlib.suppress(OSError):
            g.state.save()
        self.result.gather = summarize(g.totals, g.logs, g.checkpoints, self.rundir, self.bus)
        if g.totals.errors:
            self.result.gather_error = "; ".join(g.totals.errors[:5])

    def _finish(self) -> RunResult:
        result = self.result
        if result.failures and result.state == JobState.SUCCEEDED:
            result.state = JobState.FAILED
        result.ended_ts = time.time()
        data = result.to_dict()
        self.logs.close()  # every line is on disk before result.json says the run is over (`logs -f`)
        self.heartbeats.close()
        if self.guard.failure is not None:
            data["run_dir_error"] = self.guard.failure
        try:
            write_json_atomic(self.rundir.result_json, data)
        except OSError as exc:
            self.guard.fail(self.rundir.result_json, exc)
            print(f"tfcluster: the job {result.state.value}; result.json could not be written", file=sys.stderr)
        self.status(
            {
                "state": result.state.value,
                "attempt": len(result.attempts) - 1,
                "updated": time.time(),
                "tasks": data["tasks"],
                "finished": True,
            }
        )
        rc = result.root_cause
        self.bus.emit(
            "job_finished",
            state=result.state.value,
            wall_time_s=round(result.ended_ts - result.started_ts, 3),
            run_dir=str(self.rundir.path),
            root_cause=rc.to_dict() if rc else None,
        )
        if rc is not None and result.state != JobState.SUCCEEDED:
            _print_root_cause(rc)
        self.bus.close()
        return result


def launch(loaded: LoadedSpec, plan: Plan, opts: LaunchOptions, backend: Backend | None = None) -> RunResult:
    """`tfcluster launch`: run the job to its end."""
    return Job(loaded, plan, opts, backend).run()


def _launcher_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "hostname": socket.gethostname(),
        "argv": redact_argv(sys.argv),
        "started": time.time(),
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        info["create_time"] = process_start_time(os.getpid())
    return info


def process_start_time(pid: int) -> float:
    """When ``pid`` started, in seconds since the epoch, as psutil's ``create_time()`` computes it
    (``tfcluster stop`` compares the two): /proc/PID/stat's start time in clock ticks after boot, plus
    the boot time. Read directly: importing psutil costs the launcher's start ~70 M instructions."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm)": state is field 3
    ticks = int(fields[19])  # field 22: starttime
    with open("/proc/stat", "rb") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
    return ticks / os.sysconf("SC_CLK_TCK") + boot


def _print_root_cause(rc: Failure) -> None:
    out = sys.stderr
    where = f"{rc.task} on {rc.host}" if rc.task else "the job"
    print(f"\nroot cause: {where}: {rc.message}", file=out)
    if rc.hint:
        print(f"  fix: {rc.hint}", file=out)
    if rc.last_lines:
        print(f"last lines of {rc.task}:", file=out)
        for line in rc.last_lines[-10:]:
            print(f"  | {line}", file=out)

