"""Typed events on one bus. The supervisor and the job emit; sinks (files, console, metrics) consume."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from .base import BaseEvent


class Sink(Protocol):
    def handle(self, event: BaseEvent) -> None: ...

    def close(self) -> None: ...


class EventBus:
    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)

    def subscribe(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def emit(self, event: BaseEvent) -> BaseEvent:
        """Hand a typed event (one of ``kinds``) to every sink."""
        if not isinstance(event, BaseEvent):
            raise TypeError(f"emit() takes a typed event, got {type(event).__name__}")
        for sink in self.sinks:
            sink.handle(event)
        return event

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
