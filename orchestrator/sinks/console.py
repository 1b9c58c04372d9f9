"""The console: one human line on stderr for each event that matters."""

from __future__ import annotations

import sys
from typing import IO

from ..events import Event
from .style import use_color


class ConsoleSink:
    """Human lines on stderr for what matters: failures, teardown, stragglers, the outcome."""

    QUIET = frozenset({"task_ready", "task_spawned", "attempt_started", "gather_started"})

    def __init__(self, stream: IO | None = None, color: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.color = use_color(self.stream) if color is None else color

    def _paint(self, text: str, code: int) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def handle(self, event: Event) -> None:
        if event.event in self.QUIET:
            return
        text = describe(event)
        if text is None:
            return
        bad = event.event in (
            "worker_lost",
            "worker_hung",
            "job_stalled",
            "startup_timeout",
            "connect_failed",
            "gather_failed",
            "protocol_error",
        ) or (
            event.event == "task_exited" and event.data.get("code") not in (0, None) and not event.data.get("stopped")
        )
        warn = event.event in ("straggler", "heterogeneous_gpus", "warning", "shell_noise", "teardown", "restart", "requeued")
        prefix = self._paint("tfcluster:", 1)
        if bad:
            text = self._paint(text, 31)
        elif warn:
            text = self._paint(text, 33)
        try:
            self.stream.write(f"{prefix} {text}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        pass


def describe(ev: Event) -> str | None:
    """One line for an event, or None for events the console does not show."""
    d = ev.data
    who = f"{ev.task} ({ev.host})" if ev.task and ev.host else (ev.task or ev.host or "")
    k = ev.event
    if k == "job_started":
        return f"job {d.get('job')}: {d.get('tasks')} task(s); run directory {d.get('run_dir')}"
    if k == "metrics":
        return f"metrics: {d.get('url')}"
    if k == "connected":
        return f"connected to {d.get('hosts')} host(s) in {d.get('seconds', 0):.2f}s"
    if k == "connect_failed":
        return f"{who}: {d.get('message')}" + (f"\n  fix: {d['hint']}" if d.get("hint") else "")
    if k == "preflight":
        return None if d.get("ok", True) and not d.get("warnings") else f"preflight: {d.get('summary')}"
    if k == "task_started":
        return None
    if k == "task_exited":
        if d.get("stopped"):
            return None
        if d.get("code") == 0:
            return f"{who} finished (exit 0)"
        if d.get("signal_name"):
            return f"{who} was killed by {d['signal_name']}"
        return f"{who} exited with code {d.get('code')}"
    if k == "protocol_error":
        return f"{who}: {d.get('message')}"
    if k == "task_lost":
        return f"{who} lost: {d.get('message')}"
    if k in ("worker_lost", "worker_hung", "job_stalled", "startup_timeout", "straggler", "straggler_cleared"):
        return f"{who + ': ' if who else ''}{d.get('message')}"
    if k == "heterogeneous_gpus":
        return f"warning: {d.get('message')}"
    if k == "shell_noise":
        return (
            f"{who}: the login shell printed before worker_entry started (kept in the log): {d.get('text', '')[:120]!r}"
        )
    if k == "bound_reached":
        return f"bounded run: {d.get('message')}; stopping the job"
    if k == "teardown":
        if d.get("bounded") is True:
            return None  # bound_reached said it
        return f"tearing down the job: {d.get('reason')}"
    if k == "interrupted":
        return f"received {d.get('signal')}; tearing down (press Ctrl-C again to kill at once)"
    if k == "restart":
        return f"restarting all tasks (attempt {d.get('attempt')} of {d.get('max_attempts')}): {d.get('reason')}"
    if k == "attempt_finished":
        return None
    if k == "gather_finished":
        return f"gathered {d.get('files')} file(s), {d.get('bytes', 0) / 1e6:.1f} MB into {d.get('dest')} (verified)"
    if k == "gather_failed":
        return f"gather failed: {d.get('message')}"
    if k == "job_finished":
        return f"job {d.get('state')} in {d.get('wall_time_s', 0):.1f}s; run directory {d.get('run_dir')}"
    if k == "warning":
        return f"warning: {d.get('message')}"
    if k == "slurm_allocation":
        again = f" (restart {d.get('restart')}, attempt {d.get('first_attempt')})" if d.get("restart") else ""
        return f"slurm job {d.get('job_id')} running on {d.get('nodes')}{again}"
    if k == "requeued":
        nxt = f"; new job {d.get('new_job_id')}" if d.get("new_job_id") else ""
        return (
            f"slurm job {d.get('job_id')} {'reached its time limit' if d.get('reason') == 'timeout' else 'was preempted'}: "
            f"requeued ({d.get('how')}{nxt}; time-outs {d.get('timeouts')}, preemptions {d.get('preemptions')}); "
            f"attempt {d.get('next_attempt')} resumes from the backup"
        )
    return None
