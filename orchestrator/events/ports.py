"""What the supervisor writes to, as protocols: sinks implement them, the job wires them in.

The supervisor never imports a sink: it gets objects with these methods (a test gets fakes)."""

from __future__ import annotations

from typing import Any, Protocol


class LogSink(Protocol):
    """Complete output lines of a task (one or more, ending in a newline)."""

    def write(self, task: str, data: bytes, ts: float | None = None) -> None: ...

    def flush(self) -> None: ...


class HeartbeatSink(Protocol):
    """Heartbeats and profile samples of a task, as plain records."""

    def write(self, task: str, record: dict[str, Any]) -> None: ...


class StatusSink(Protocol):
    """The live status snapshot (every second, and at the end)."""

    def __call__(self, status: dict[str, Any]) -> None: ...
