"""Stage 7: sinks. Where events, heartbeats and output lines go: run-directory files, the console,
the live table on a terminal."""

from .console import ConsoleSink, describe
from .files import EventFileSink, HeartbeatFile
from .guard import GuardedFile, WriteGuard
from .logs import LogRouter
from .style import PALETTE, use_color

__all__ = [
    "PALETTE",
    "ConsoleSink",
    "EventFileSink",
    "GuardedFile",
    "HeartbeatFile",
    "LogRouter",
    "WriteGuard",
    "describe",
    "use_color",
]
