"""The console: one human line on stderr for each event that matters.

Each kind that shows has one renderer in ``RENDERERS`` (keyed by its class), which also picks the
line's colour; kinds without one (a task ready or spawned, an attempt started, ...) stay quiet.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from ..core.terminal import safe_text
from ..events import BaseEvent
from ..events import kinds as k
from .style import use_color

PLAIN, BAD, WARN = 0, 31, 33  # ANSI colours


@dataclass(frozen=True)
class Line:
    text: str
    color: int = PLAIN


E = TypeVar("E", bound=BaseEvent)
RENDERERS: dict[type[BaseEvent], Callable[[Any], Line | None]] = {}


def renders(*kinds: type[E]) -> Callable[[Callable[[E], Line | None]], Callable[[E], Line | None]]:
    """Register the renderer of these kinds."""

    def register(fn: Callable[[E], Line | None]) -> Callable[[E], Line | None]:
        for kind in kinds:
            RENDERERS[kind] = fn
        return fn

    return register


class ConsoleSink:
    """Human lines on stderr for what matters: failures, teardown, stragglers, the outcome."""

    def __init__(self, stream: IO | None = None, color: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.color = use_color(self.stream) if color is None else color

    def _paint(self, text: str, code: int) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and code else text

    def handle(self, event: BaseEvent) -> None:
        line = console_line(event)
        if line is None:
            return
        text = safe_text(line.text)  # an event's text may quote a node (messages, reasons, hostnames)
        try:
            self.stream.write(f"{self._paint('tfcluster:', 1)} {self._paint(text, line.color)}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        pass


def console_line(ev: BaseEvent) -> Line | None:
    """The console's line for an event, or None for events the console does not show."""
    render = RENDERERS.get(type(ev))
    return render(ev) if render is not None else None


def describe(ev: BaseEvent) -> str | None:
    """One line for an event, or None for events the console does not show."""
    line = console_line(ev)
    return line.text if line is not None else None


def _who(ev: BaseEvent) -> str:
    return f"{ev.task} ({ev.host})" if ev.task and ev.host else (ev.task or ev.host or "")


@renders(k.JobStarted)
def _job_started(e: k.JobStarted) -> Line:
    return Line(f"job {e.job}: {e.tasks} task(s); run directory {e.run_dir}")


@renders(k.MetricsServed)
def _metrics(e: k.MetricsServed) -> Line:
    return Line(f"metrics: {e.url}")


@renders(k.Connected)
def _connected(e: k.Connected) -> Line:
    return Line(f"connected to {e.hosts} host(s) in {e.seconds:.2f}s")


@renders(k.ConnectFailed)
def _connect_failed(e: k.ConnectFailed) -> Line:
    return Line(f"{_who(e)}: {e.message}" + (f"\n  fix: {e.hint}" if e.hint else ""), BAD)


@renders(k.Preflight)
def _preflight(e: k.Preflight) -> Line | None:
    return None if e.ok and not e.warnings else Line(f"preflight: {e.summary}")


@renders(k.ScriptHint)
def _script_hint(e: k.ScriptHint) -> Line:
    return Line(f"{_who(e)}: hint: {e.message}", WARN)


@renders(k.TaskExited)
def _task_exited(e: k.TaskExited) -> Line | None:
    if e.stopped:
        return None
    if e.code == 0:
        return Line(f"{_who(e)} finished (exit 0)")
    color = BAD if e.code is not None else PLAIN
    if e.signal_name:
        return Line(f"{_who(e)} was killed by {e.signal_name}", color)
    return Line(f"{_who(e)} exited with code {e.code}", color)


@renders(k.ExitUnconfirmed)
def _exit_unconfirmed(e: k.ExitUnconfirmed) -> Line:
    return Line(f"warning: {e.message}", WARN)


@renders(k.NodeProtocolError)
def _protocol_error(e: k.NodeProtocolError) -> Line:
    return Line(f"{_who(e)}: {e.message}", BAD)


@renders(k.ConnectionRefused)
def _connection_refused(e: k.ConnectionRefused) -> Line:
    what = "a connection" if e.count == 1 else f"{e.count} connections"
    return Line(f"connect-back port refused {what} ({e.total} in all; first from {e.peer}: {e.reason})", WARN)


@renders(k.TaskLost)
def _task_lost(e: k.TaskLost) -> Line:
    return Line(f"{_who(e)} lost: {e.message}")


@renders(k.WorkerLost, k.WorkerHung, k.JobStalled, k.StartupTimeout)
def _verdict(e: k.WorkerLost | k.WorkerHung | k.JobStalled | k.StartupTimeout) -> Line:
    return Line(f"{_who(e) + ': ' if _who(e) else ''}{e.message}", BAD)


@renders(k.Straggler)
def _straggler(e: k.Straggler) -> Line:
    return Line(f"{_who(e) + ': ' if _who(e) else ''}{e.message}", WARN)


@renders(k.GpuProblemFound)
def _gpu_problem(e: k.GpuProblemFound) -> Line:
    return Line(f"{e.message}" + (f" (host {e.host})" if e.host else ""), WARN)


@renders(k.StragglerCleared)
def _straggler_cleared(e: k.StragglerCleared) -> Line:
    return Line(f"{_who(e) + ': ' if _who(e) else ''}{e.message}")


@renders(k.HeterogeneousGpus, k.JobWarning)
def _warning(e: k.HeterogeneousGpus | k.JobWarning) -> Line:
    return Line(f"warning: {e.message}", WARN)


@renders(k.ShellNoise)
def _shell_noise(e: k.ShellNoise) -> Line:
    return Line(
        f"{_who(e)}: the login shell printed before worker_entry started (kept in the log): {e.text[:120]!r}", WARN
    )


@renders(k.BoundReached)
def _bound_reached(e: k.BoundReached) -> Line:
    return Line(f"bounded run: {e.message}; stopping the job")


@renders(k.RoleFailure)
def _role_failure(e: k.RoleFailure) -> Line:
    then = f"restarting it in place (restart {e.restarts})" if e.action == "restart" else "training goes on without it"
    return Line(f"{_who(e)}: {e.message}; its role ({e.role}) does not stop the job: {then}", WARN)


@renders(k.TrainingEnded)
def _training_ended(e: k.TrainingEnded) -> Line:
    return Line(e.message)


@renders(k.Teardown)
def _teardown(e: k.Teardown) -> Line | None:
    return None if e.bounded else Line(f"tearing down the job: {e.reason}", WARN)  # bound_reached said it


@renders(k.Interrupted)
def _interrupted(e: k.Interrupted) -> Line:
    return Line(f"received {e.signal}; tearing down (press Ctrl-C again to kill at once)")


@renders(k.TrainingCompleted)
def _training_completed(e: k.TrainingCompleted) -> Line:
    return Line(e.message)


@renders(k.Restart)
def _restart(e: k.Restart) -> Line:
    return Line(f"restarting all tasks (attempt {e.attempt} of {e.max_attempts}): {e.reason}", WARN)


@renders(k.Reshaped)
def _reshaped(e: k.Reshaped) -> Line:
    fewer = e.workers_before - e.workers_after
    came = f"spare {e.spare_in} takes its place" if e.spare_in else f"no spare left: {fewer} worker(s) fewer"
    return Line(
        f"host {e.host} ({e.task}) is out for good ({e.reason}); {came}: {e.workers_before} -> {e.workers_after} "
        f"workers, {e.spares_left} spare(s) left",
        WARN,
    )


@renders(k.GatherFinished)
def _gather_finished(e: k.GatherFinished) -> Line:
    return Line(f"gathered {e.files} file(s), {e.bytes / 1e6:.1f} MB into {e.dest} (verified)")


@renders(k.GatherFailed)
def _gather_failed(e: k.GatherFailed) -> Line:
    return Line(f"gather failed: {e.message}", BAD)


@renders(k.JobFinished)
def _job_finished(e: k.JobFinished) -> Line:
    return Line(f"job {e.state} in {e.wall_time_s:.1f}s; run directory {e.run_dir}")


@renders(k.SlurmAllocation)
def _slurm_allocation(e: k.SlurmAllocation) -> Line:
    again = f" (restart {e.restart}, attempt {e.first_attempt})" if e.restart else ""
    return Line(f"slurm job {e.job_id} running on {e.nodes}{again}")


@renders(k.Requeued)
def _requeued(e: k.Requeued) -> Line:
    ended = "reached its time limit" if e.reason == "timeout" else "was preempted"
    return Line(
        f"slurm job {e.job_id} {ended}: requeued ({e.how}; time-outs {e.timeouts}, preemptions {e.preemptions}); "
        f"attempt {e.next_attempt} resumes from the backup",
        WARN,
    )
