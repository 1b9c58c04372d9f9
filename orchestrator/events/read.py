"""Reading events.jsonl back into typed events, for the views and the login-node follower.

A run directory may be torn (a crash mid-line), hand-edited or hostile: whatever a line holds, reading
gives the events that are intact and skips the rest, never a traceback. Unknown kinds (a newer launcher)
are skipped like damaged lines: consumers ignore what they do not know.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runs import read_jsonl
from .base import BaseEvent
from .kinds import EVENT_TYPES


def event_from_dict(data: Any) -> BaseEvent:
    """The typed event of one record; ``ValueError``/``TypeError`` naming the field when it is damaged."""
    if not isinstance(data, dict):
        raise TypeError(f"an event is a JSON object, got {type(data).__name__}")
    kind = data.get("event")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"event: unknown event kind {str(kind)[:60]!r}")
    return cls.from_dict(data)


def parse_events(records: Any) -> list[BaseEvent]:
    """The intact events among ``records`` (dicts, as read from a file), in their order."""
    out = []
    for rec in records:
        try:
            out.append(event_from_dict(rec))
        except (ValueError, TypeError):
            continue
    return out


def read_events(path: Path) -> list[BaseEvent]:
    """The intact events of an events.jsonl file (none when it does not exist)."""
    return parse_events(read_jsonl(path))
