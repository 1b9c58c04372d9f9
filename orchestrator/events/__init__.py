"""Stage 5: events. One bus of typed events; the ports the supervisor writes logs and heartbeats to."""

from .bus import EVENT_KINDS, Event, EventBus, Sink
from .ports import HeartbeatSink, LogSink, StatusSink

__all__ = ["EVENT_KINDS", "Event", "EventBus", "HeartbeatSink", "LogSink", "Sink", "StatusSink"]
