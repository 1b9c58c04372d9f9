"""Typed events on one bus. The supervisor and the job emit; sinks (files, console, status) consume."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .kinds import EVENT_KINDS


@dataclass(frozen=True)
class Event:
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


class Sink(Protocol):
    def handle(self, event: Event) -> None: ...

    def close(self) -> None: ...


class EventBus:
    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)

    def subscribe(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def emit(self, event: str, *, task: str | None = None, host: str | None = None, **data: Any) -> Event:
        assert event in EVENT_KINDS, event
        ev = Event(event=event, task=task, host=host, data=data)
        for sink in self.sinks:
            sink.handle(ev)
        return ev

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
