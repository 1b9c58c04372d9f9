"""Where events, heartbeats and log lines go: run-directory files and the console."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from .events import Event
from .rundir import RunDir

PALETTE = (36, 33, 35, 32, 34, 96, 93, 95, 92, 94, 91, 31)


def use_color(stream: IO) -> bool:
    """Color only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR") is not None:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class EventFileSink:
    """events.jsonl: one JSON object a line, flushed per event so `status`/`logs -f` see it at once."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the run

    def handle(self, event: Event) -> None:
        self.f.write(json.dumps(event.to_dict(), default=str, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.f.close()


class HeartbeatFile:
    """heartbeats.jsonl: compact samples per task, for `status`, `report` and post-mortems."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a")  # noqa: SIM115
        self._last_flush = time.monotonic()

    def write(self, task: str, record: dict[str, Any]) -> None:
        rec = {"task": task, **record}
        self.f.write(json.dumps(rec, default=str, separators=(",", ":")) + "\n")
        now = time.monotonic()
        if now - self._last_flush > 1.0:
            self.f.flush()
            self._last_flush = now

    def close(self) -> None:
        self.f.close()


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
        ) or (
            event.event == "task_exited" and event.data.get("code") not in (0, None) and not event.data.get("stopped")
        )
        warn = event.event in ("straggler", "heterogeneous_gpus", "warning", "shell_noise", "teardown", "restart")
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
    if k == "connected":
        return f"connected to {d.get('hosts')} host(s) in {d.get('seconds', 0):.2f}s"
    if k == "connect_failed":
        return f"{who}: {d.get('message')}"
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
    if k == "teardown":
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
    return None


class LogRouter:
    """Every line of every task: raw per-task file, prefixed combined.log, and the console.

    Frames carry whole lines, so prefixing is one bytes.replace per frame, not a loop per line.
    """

    def __init__(self, rundir: RunDir, *, echo: bool = True, out: IO[bytes] | None = None, color: bool | None = None):
        self.rundir = rundir
        self.echo = echo
        self.out = out or sys.stdout.buffer
        self.color = use_color(sys.stdout) if color is None else color
        self.combined = open(rundir.combined_log, "ab")  # noqa: SIM115
        self.files: dict[str, IO[bytes]] = {}
        self.prefix: dict[str, bytes] = {}
        self.console_prefix: dict[str, bytes] = {}
        self.lines_written: dict[str, int] = {}
        self.console_hook: Any = None  # set by the live display to print above its table
        self._dirty = False

    def open_attempt(self, attempt: int, tasks: list[tuple[str, str, str]]) -> None:
        """tasks: (task, slug, host). Opens this attempt's per-task files."""
        for f in self.files.values():
            f.close()
        self.files = {}
        for i, (task, slug, host) in enumerate(tasks):
            self.files[task] = open(self.rundir.task_log(slug, attempt), "ab")  # noqa: SIM115
            tag = f"[{task} {host}] "
            self.prefix[task] = tag.encode()
            color = PALETTE[i % len(PALETTE)]
            self.console_prefix[task] = (f"\x1b[{color}m{tag}\x1b[0m" if self.color else tag).encode()
            self.lines_written.setdefault(task, 0)
        if attempt:
            self.note(f"=== attempt {attempt} ===")

    def write(self, task: str, data: bytes, ts: float | None = None) -> None:
        """`data` is one or more complete lines (ending in a newline)."""
        if not data:
            return
        f = self.files.get(task)
        if f is not None:
            f.write(data)
        self.lines_written[task] = self.lines_written.get(task, 0) + data.count(b"\n")
        body = data[:-1] if data.endswith(b"\n") else data
        stamp = (iso(ts or time.time()) + " ").encode()
        tag = stamp + self.prefix.get(task, f"[{task}] ".encode())
        self.combined.write(tag + body.replace(b"\n", b"\n" + tag) + b"\n")
        if self.echo:
            ctag = self.console_prefix.get(task, tag)
            text = ctag + body.replace(b"\n", b"\n" + ctag) + b"\n"
            if self.console_hook is not None:
                self.console_hook(text)
            else:
                try:
                    self.out.write(text)
                except (OSError, ValueError):
                    self.echo = False
        self._dirty = True

    def note(self, text: str) -> None:
        """A launcher line in combined.log (attempt boundaries)."""
        self.combined.write(f"{iso(time.time())} [tfcluster] {text}\n".encode())
        self._dirty = True

    def flush(self) -> None:
        if not self._dirty:
            return
        for f in self.files.values():
            f.flush()
        self.combined.flush()
        if self.echo and self.console_hook is None:
            try:
                self.out.flush()
            except (OSError, ValueError):
                self.echo = False
        self._dirty = False

    def close(self) -> None:
        if self.combined.closed:
            return
        self.flush()
        for f in self.files.values():
            f.close()
        self.files = {}
        self.combined.close()
