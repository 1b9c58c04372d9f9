"""Stage 5: events. One bus of typed events (``kinds``: a dataclass per kind; ``read``: events.jsonl back
into them); the ports the supervisor writes logs and heartbeats to."""

from .base import BaseEvent
from .bus import EventBus, Sink
from .kinds import EVENT_KINDS, EVENT_TYPES
from .ports import HeartbeatSink, LogSink, StatusSink
from .read import event_from_dict, parse_events, read_events

__all__ = [
    "EVENT_KINDS",
    "EVENT_TYPES",
    "BaseEvent",
    "EventBus",
    "HeartbeatSink",
    "LogSink",
    "Sink",
    "StatusSink",
    "event_from_dict",
    "parse_events",
    "read_events",
]
