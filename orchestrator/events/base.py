"""The base of every typed event: common fields, the events.jsonl shape, validation on reading.

An event is a frozen, keyword-only dataclass; its kind is the class constant ``KIND``. ``to_dict`` gives
the line events.jsonl has always held: ``{"ts": 3 decimals, "event": KIND, "task"?, "host"?, ...fields}``
(users' scripts and ``tfcluster logs/status/report`` read it). ``from_dict`` validates a line with the
protocol's own field checks (``worker_entry.protocol.schema``: type hints plus ``spec()`` ranges and
lengths), so a damaged record is one ``ValueError``/``TypeError`` naming ``kind.field``.

Reading rules (old run directories, hand-edited files): unknown keys are ignored (newer launchers may add
some); a missing field reads as its default, or as null where its type allows null; ``ts`` and every
other field are required. A field may carry a ``repair`` function in its metadata: detail that views can
do without (a damaged ``root_cause``, a bad GPU entry) is dropped rather than losing the whole event.
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from worker_entry.protocol import Record, spec
from worker_entry.protocol.schema import LONG

E = TypeVar("E", bound="BaseEvent")

#: free text (messages, reasons, summaries): longer than an identifier may be
TEXT = spec(max_len=LONG * 16)
#: counts, attempts, durations: never negative
COUNT = spec(lo=0)
#: per-task maps and lists: as many entries as a plan may have tasks
MANY = spec(max_len=1 << 20)
#: an optional detail written only when it is set (worker_hung's ``state`` or ``steps``, ``suspect``)
SOMETIMES = {"omit": True}
COMMON = ("ts", "task", "host")


@dataclass(frozen=True)
class _Field:
    name: str
    required: bool  # when the key is missing on reading
    nullable: bool
    has_default: bool
    check: Callable[[Any, str, int], Any]
    repair: Callable[[Any], Any] | None


@dataclass(frozen=True, kw_only=True)
class BaseEvent(Record):
    """One event of a run; subclasses add their fields (docs/events.md lists them)."""

    KIND: ClassVar[str] = ""
    ts: float = field(default_factory=time.time, metadata=COUNT)
    task: str | None = None
    host: str | None = None

    @property
    def event(self) -> str:
        """The kind, as the ``event`` key of its line."""
        return self.KIND

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ts": round(self.ts, 3), "event": self.KIND}
        if self.task is not None:
            d["task"] = self.task
        if self.host is not None:
            d["host"] = self.host
        for f in dataclasses.fields(self):
            if f.name in COMMON:
                continue
            value = getattr(self, f.name)
            if f.metadata.get("omit") and value == f.default:
                continue
            d[f.name] = value
        return d

    @classmethod
    def from_dict(cls: type[E], data: Any, path: str = "", depth: int = 0) -> E:  # type: ignore[override]
        """The event of one events.jsonl record; ``ValueError``/``TypeError`` naming the field if damaged."""
        if not isinstance(data, dict):
            raise TypeError(f"{cls.KIND}: expected a JSON object, got {type(data).__name__}")
        if data.get("event") != cls.KIND:
            raise ValueError(f"{cls.KIND}: the record is a {data.get('event')!r} event")
        kwargs: dict[str, Any] = {}
        for f in cls._schema():
            where = f"{cls.KIND}.{f.name}"
            if f.name not in data:
                if f.required:
                    raise ValueError(f"{where}: required field is missing")
                if not f.has_default:
                    kwargs[f.name] = None
                continue
            value = data[f.name] if f.repair is None else f.repair(data[f.name])
            kwargs[f.name] = f.check(value, where, 1)
        return cls(**kwargs)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The kind's own fields (not ``ts``, ``task``, ``host``), in the order of its line."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in COMMON)  # type: ignore[arg-type]

    @classmethod
    def _schema(cls) -> list[_Field]:
        """Each field's reading rule and compiled check, built once per class."""
        cached = cls.__dict__.get("_schema_cache")
        if cached is not None:
            return cached
        hints = typing.get_type_hints(cls)
        checks = {name: check for name, _, check in cls._validators()}
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            nullable = type(None) in typing.get_args(hints[f.name])
            required = f.name == "ts" or not (has_default or nullable)
            out.append(_Field(f.name, required, nullable, has_default, checks[f.name], f.metadata.get("repair")))
        cls._schema_cache = out  # type: ignore[attr-defined]
        return out


def is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def failure_or_none(value: Any) -> Any:
    """A ``root_cause``: a failure record (``core.result.Failure.to_dict``) kept as read, or null when
    it is not a mapping or its ``ts`` is not a number (views date failures with it)."""
    if isinstance(value, dict) and (value.get("ts") is None or is_number(value.get("ts"))):
        return value
    return None


def gpu_models(value: Any) -> Any:
    """task_ready's ``gpus``: entries that are not a mapping with a string ``name`` and a finite, non-negative
    ``memory_mb`` (or none) are dropped; a value that is not a list reads as no GPUs."""
    if not isinstance(value, list):
        return []
    return [
        g
        for g in value
        if isinstance(g, dict)
        and isinstance(g.get("name", ""), str)
        and (g.get("memory_mb") is None or (is_number(g["memory_mb"]) and g["memory_mb"] >= 0))
    ]
