"""`tfcluster launch`: run directory, connections, attempts (restarts), gather, result.

Returns a RunResult; cli.py turns it into an exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .connect import HostFailure, close_all, connect_all
from .events import EventBus
from .plan import Plan
from .result import AttemptResult, Failure, JobState, RunResult
from .rundir import RunDir, write_json_atomic
from .sinks import ConsoleSink, EventFileSink, HeartbeatFile, LogRouter, use_color
from .specload import LoadedSpec
from .supervisor import Interrupt, Supervisor
from .transport.ssh import KeyCache

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str | None = None
    preflight: bool = True
    gather: bool = True
    live: bool = True
    echo_logs: bool = True


@contextlib.contextmanager
def signals_to(interrupt: Interrupt) -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP on the launcher mean: tear the job down cleanly, then exit."""
    previous = {}
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[s] = signal.signal(s, lambda signum, frame: interrupt.trigger(signum))
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _launcher_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "hostname": socket.gethostname(),
        "argv": sys.argv,
        "started": time.time(),
    }
    if psutil is not None:
        with contextlib.suppress(Exception):
            info["create_time"] = psutil.Process().create_time()
    return info


def _connect_failures_text(failures: list[HostFailure]) -> str:
    lines = [f"cannot reach {len(failures)} host(s):"]
    for f in failures:
        lines.append(f"  {f.task} ({f.host}): [{f.failure.kind}] {f.failure}")
    return "\n".join(lines)


def launch(loaded: LoadedSpec, plan: Plan, opts: LaunchOptions) -> RunResult:
    spec = loaded.spec
    rundir = RunDir.create(opts.run_dir or os.path.join("runs", plan.run_id))
    rundir.spec_yaml.write_text(loaded.text)
    os.chmod(rundir.spec_yaml, 0o600)
    write_json_atomic(rundir.plan_json, plan.to_dict(), durable=False)
    write_json_atomic(rundir.launcher_json, _launcher_info(), durable=False)

    bus = EventBus([EventFileSink(rundir.events_jsonl), ConsoleSink()])
    logs = LogRouter(rundir, echo=opts.echo_logs)
    heartbeats = HeartbeatFile(rundir.heartbeats_jsonl)
    interrupt = Interrupt()
    started = time.time()
    result = RunResult(
        job=plan.job,
        run_id=plan.run_id,
        run_dir=str(rundir.path),
        state="starting",
        started_ts=started,
        ended_ts=started,
    )
    live = None
    if opts.live and opts.echo_logs and use_color(sys.stdout) and sys.stdout.isatty():
        from .live import LiveTable

        live = LiveTable(plan)
        logs.console_hook = live.print_log

    last_tasks: dict[str, dict[str, Any]] = {}

    def on_status(status: dict[str, Any]) -> None:
        if status.get("finished"):  # keep the last metrics, take states and exit codes from the result
            status["tasks"] = {t: {**last_tasks.get(t, {}), **v} for t, v in status.get("tasks", {}).items()}
        else:
            last_tasks.update(status.get("tasks", {}))
        status = {"job": plan.job, "run_id": plan.run_id, "launcher_pid": os.getpid(), **status}
        with contextlib.suppress(OSError):
            write_json_atomic(rundir.status_json, status, indent=None, durable=False)
        if live is not None and live.active:
            live.update(status)

    for w in loaded.warnings:
        bus.emit("warning", message=str(w))
    for w in plan.warnings:
        bus.emit("warning", message=w)
    bus.emit(
        "job_started",
        job=plan.job,
        run_id=plan.run_id,
        run_dir=str(rundir.path),
        tasks=len(plan.nodes),
        attempt_limit=spec.restart.max_restarts + 1,
    )
    keys = KeyCache()
    conns: dict = {}
    try:
        with signals_to(interrupt):
            if live is not None:
                live.start()
            conns, failures, secs = connect_all(plan.nodes, keys)
            if failures:
                for f in failures:
                    bus.emit("connect_failed", task=f.task, host=f.host, kind=f.failure.kind, message=str(f.failure))
                result.failures.append(
                    Failure(
                        "connect", _connect_failures_text(failures), time.time(), failures[0].task, failures[0].host
                    )
                )
                result.state = "connect_failed"
                return _finish(result, rundir, bus, logs, heartbeats, on_status)
            bus.emit("connected", hosts=len(conns), seconds=round(secs, 3))
            if interrupt.count:
                result.state = (
                    JobState.INTERRUPTED_SIGTERM.value
                    if interrupt.signum == signal.SIGTERM
                    else JobState.INTERRUPTED_SIGINT.value
                )
                return _finish(result, rundir, bus, logs, heartbeats, on_status)
            attempt = 0
            while True:
                logs.open_attempt(attempt, [(str(n.task), n.task.slug, n.host) for n in plan.nodes])
                sup = Supervisor(
                    spec,
                    plan,
                    conns,
                    attempt=attempt,
                    bus=bus,
                    logs=logs,
                    heartbeats=heartbeats,
                    interrupt=interrupt,
                    preflight=opts.preflight,
                    on_status=on_status,
                )
                res: AttemptResult = sup.run()
                result.attempts.append(res)
                bus.emit(
                    "attempt_finished",
                    attempt=attempt,
                    state=res.state.value,
                    root_cause=res.root_cause.to_dict() if res.root_cause else None,
                )
                if res.state != JobState.FAILED or attempt >= spec.restart.max_restarts or interrupt.count:
                    break
                attempt += 1
                bus.emit(
                    "restart",
                    attempt=attempt,
                    max_attempts=spec.restart.max_restarts + 1,
                    reason=res.root_cause.message if res.root_cause else "failed",
                )
                dead = [n for n in plan.nodes if str(n.task) not in conns or not conns[str(n.task)].is_alive()]
                if dead:
                    for n in dead:
                        if str(n.task) in conns:
                            conns.pop(str(n.task)).close()
                    more, failures, _ = connect_all(dead, keys)
                    conns.update(more)
                    if failures:
                        for f in failures:
                            bus.emit(
                                "connect_failed", task=f.task, host=f.host, kind=f.failure.kind, message=str(f.failure)
                            )
                        result.failures.append(
                            Failure(
                                "connect",
                                _connect_failures_text(failures),
                                time.time(),
                                failures[0].task,
                                failures[0].host,
                                attempt=attempt,
                            )
                        )
                        break
                _sync_backup(plan, conns, bus)
            result.state = result.attempts[-1].state.value if result.attempts else "failed"
            if result.failures and result.state == "succeeded":
                result.state = "failed"
            if live is not None:
                live.stop()  # the gather's progress bar and the summary print below it
            if opts.gather and not interrupt.count >= 2:
                _gather(spec, plan, conns, rundir, bus, logs, result)
            return _finish(result, rundir, bus, logs, heartbeats, on_status)
    finally:
        if live is not None:
            live.stop()
        close_all(conns)


def _sync_backup(plan: Plan, conns: dict, bus: EventBus) -> None:
    """Every task must restore from the chief's backup; copy it where storage is not shared."""
    from .backup import sync_backup

    try:
        sync_backup(plan, conns, bus)
    except Exception as exc:  # the restart still happens; Keras then starts those tasks from scratch
        bus.emit("warning", message=f"could not copy the chief's backup to the other tasks: {exc}")


def _gather(
    spec: Any, plan: Plan, conns: dict, rundir: RunDir, bus: EventBus, logs: LogRouter, result: RunResult
) -> None:
    from .gather import gather_after_run

    logs.flush()
    try:
        result.gather = gather_after_run(spec, plan, conns, rundir, bus, attempts=len(result.attempts))
    except Exception as exc:  # gathering must never hide the job's own outcome
        result.gather_error = f"{type(exc).__name__}: {exc}"
        bus.emit("gather_failed", message=result.gather_error)
    else:
        if result.gather and result.gather.get("errors"):
            result.gather_error = "; ".join(result.gather["errors"][:5])


def _finish(
    result: RunResult, rundir: RunDir, bus: EventBus, logs: LogRouter, heartbeats: HeartbeatFile, on_status: Any
) -> RunResult:
    result.ended_ts = time.time()
    data = result.to_dict()
    logs.close()  # every line is on disk before result.json says the run is over (`logs -f` relies on it)
    heartbeats.close()
    write_json_atomic(rundir.result_json, data)
    on_status(
        {
            "state": result.state,
            "attempt": len(result.attempts) - 1,
            "updated": time.time(),
            "tasks": data["tasks"],
            "finished": True,
        }
    )
    rc = result.root_cause
    bus.emit(
        "job_finished",
        state=result.state,
        wall_time_s=round(result.ended_ts - result.started_ts, 3),
        run_dir=str(rundir.path),
        root_cause=rc.to_dict() if rc else None,
    )
    if rc is not None and result.state != "succeeded":
        _print_root_cause(rc)
    bus.close()
    return result


def _print_root_cause(rc: Failure) -> None:
    out = sys.stderr
    where = f"{rc.task} on {rc.host}" if rc.task else "the job"
    print(f"\nroot cause: {where}: {rc.message}", file=out)
    if rc.last_lines:
        print(f"last lines of {rc.task}:", file=out)
        for line in rc.last_lines[-10:]:
            print(f"  | {line}", file=out)


def gather_run(rundir: RunDir) -> dict[str, Any]:
    """`tfcluster gather RUN`: reconnect with the run's saved spec and finish a gather."""
    from .cli import load_plan
    from .errors import ConnectError, GatherError
    from .gather import gather_after_run

    plan_data = json.loads(rundir.plan_json.read_text())
    loaded, plan = load_plan(str(rundir.spec_yaml), plan_data.get("run_id"))
    result = rundir.read_json(rundir.result_json) or {}
    attempts = max(1, len(result.get("attempts", [])))
    conns, failures, _ = connect_all(plan.nodes)
    try:
        if failures:
            raise ConnectError([(f"{f.task} ({f.host})", str(f.failure)) for f in failures])
        bus = EventBus([EventFileSink(rundir.events_jsonl), ConsoleSink()])
        try:
            summary = gather_after_run(loaded.spec, plan, conns, rundir, bus, attempts=attempts)
        finally:
            bus.close()
        if summary.get("errors"):
            raise GatherError("; ".join(summary["errors"][:5]))
        if result:
            result["gather"] = summary
            result["gather_error"] = None
            write_json_atomic(rundir.result_json, result)
        return summary
    finally:
        close_all(conns)
