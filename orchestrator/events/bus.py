"""Typed events on one bus. The supervisor and the job emit; sinks (files, console, metrics) consume."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .base import BaseEvent
from .kinds import EVENT_TYPES
from .read import event_from_dict


def build_event(kind: str, /, **fields: Any) -> BaseEvent:
    """The typed event of ``kind`` with ``fields`` (``task``, ``host``, ``ts`` included), built strictly:
    an unknown kind, an unknown field or a missing one is a ``TypeError`` where it is emitted."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise TypeError(f"unknown event kind {kind!r} (orchestrator.events.kinds lists every kind)")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise TypeError(f"{kind}: {exc}") from None


@dataclass(frozen=True)
class Event:
    """Transitional: an untyped event, as ``views/follow.py`` still builds one from a line of
    events.jsonl. Sinks take it through ``typed()``; new code reads lines with ``read.event_from_dict``."""

    event: str
    ts: float = field(default_factory=time.time)
    task: str | None = None
    host: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ts": round(self.ts, 3), "event": self.event}
        if self.task is not None:
            d["task"] = self.task
        if self.host is not None:
            d["host"] = self.host
        d.update(self.data)
        return d

    def typed(self) -> BaseEvent:
        """The typed event, validated as a line is; ``ValueError``/``TypeError`` when damaged."""
        return event_from_dict(self.to_dict())


class Sink(Protocol):
    def handle(self, event: BaseEvent) -> None: ...

    def close(self) -> None: ...


class EventBus:
    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)

    def subscribe(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def emit(self, event: BaseEvent | str, /, **fields: Any) -> BaseEvent:
        """Hand a typed event to every sink. Transitional form: ``emit("kind", task=..., **fields)``
        builds the typed event through the registry, strictly (see ``build_event``)."""
        if isinstance(event, str):
            event = build_event(event, **fields)
        elif fields:
            raise TypeError(f"emit({type(event).__name__}(...)) takes no other arguments, got {sorted(fields)}")
        elif not isinstance(event, BaseEvent):
            raise TypeError(f"emit() takes a typed event, got {type(event).__name__}")
        for sink in self.sinks:
            sink.handle(event)
        return event

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
