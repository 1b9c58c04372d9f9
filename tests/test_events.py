"""Typed events: every kind survives events.jsonl (to_dict → JSON → from_dict), a damaged record is refused
naming its field, the reader skips what it cannot trust, the console renders every kind, and the bus
builds the transitional string form strictly."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from orchestrator.events import (
    EVENT_KINDS,
    EVENT_TYPES,
    BaseEvent,
    EventBus,
    event_from_dict,
    parse_events,
    read_events,
)
from orchestrator.events import kinds as k
from orchestrator.sinks import ConsoleSink, EventFileSink, describe

TS = 1_800_000_000.125  # exact in binary and at 3 decimals: survives the line's rounding


def _value(tp: Any, name: str, variant: int) -> Any:
    """A valid value of type ``tp``; ``variant`` 1 takes null where the type allows it."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if variant == 1 else _value(args[0], name, variant)
    if origin is list:
        if name == "gpus":
            return [{"name": "NVIDIA A100", "memory_mb": 81920}]
        return [_value(typing.get_args(tp)[0], name, variant)]
    if origin is dict:
        if name == "root_cause":
            return {"kind": "exit", "message": "exited with code 3", "ts": TS, "task": "worker:1"}
        return {
            "worker:0": _value(typing.get_args(tp)[1], name, variant),
            "worker:1": _value(typing.get_args(tp)[1], name, 0),
        }
    if tp is Any:
        return "anything"
    return {bool: True, int: 3, float: 2.5, str: f"{name} text"}[tp]


def build(cls: type[BaseEvent], variant: int = 0) -> BaseEvent:
    """An instance of any kind, from its dataclass fields alone (variant 1: nulls and no task/host)."""
    hints = typing.get_type_hints(cls)
    kwargs = {
        f.name: _value(hints[f.name], f.name, variant)
        for f in dataclasses.fields(cls)
        if f.name != "ts" and not (variant == 1 and f.name in ("task", "host"))
    }
    return cls(ts=TS, **kwargs)


ALL = [pytest.param(cls, v, id=f"{kind}-{v}") for kind, cls in sorted(EVENT_TYPES.items()) for v in (0, 1)]


def test_the_registry_has_one_class_per_kind():
    assert frozenset(EVENT_TYPES) == EVENT_KINDS
    assert all(kind == cls.KIND and dataclasses.is_dataclass(cls) for kind, cls in EVENT_TYPES.items())
    assert len(set(EVENT_TYPES.values())) == len(EVENT_TYPES)


@pytest.mark.parametrize(("cls", "variant"), ALL)
def test_every_kind_round_trips_through_its_line(cls, variant):
    ev = build(cls, variant)
    line = json.loads(json.dumps(ev.to_dict()))
    assert list(line)[:2] == ["ts", "event"] and line["event"] == cls.KIND and line["ts"] == TS
    assert ("task" in line) == (ev.task is not None) and ("host" in line) == (ev.host is not None)
    back = cls.from_dict(line)
    assert back == ev and event_from_dict(line) == ev
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.ts = 0.0  # type: ignore[misc]


def test_the_line_keeps_the_format_readers_know():
    """The keys and values events.jsonl always had; task_exited has one field set, nulls included."""
    ev = k.TaskExited(
        ts=TS,
        task="worker:1",
        host="10.0.0.2",
        code=None,
        signal=None,
        signal_name=None,
        stopped=True,
        reason="no exit confirmation before the teardown deadline",
    )
    assert ev.to_dict() == {
        "ts": TS,
        "event": "task_exited",
        "task": "worker:1",
        "host": "10.0.0.2",
        "code": None,
        "signal": None,
        "signal_name": None,
        "stopped": True,
        "reason": "no exit confirmation before the teardown deadline",
    }
    assert k.JobWarning(ts=1.23456, message="m").to_dict() == {"ts": 1.235, "event": "warning", "message": "m"}
    # worker_hung and worker_lost write only what applies, as before
    assert k.WorkerHung(ts=TS, task="worker:0", message="m", steps=7).to_dict() == {
        "ts": TS,
        "event": "worker_hung",
        "task": "worker:0",
        "message": "m",
        "steps": 7,
    }
    lost = k.WorkerLost(ts=TS, message="m", silent_s=3.0, suspect=True)
    assert (
        lost.to_dict()["suspect"] is True and "suspect" not in k.WorkerLost(ts=TS, message="m", silent_s=3.0).to_dict()
    )


def _wrong(value: Any) -> Any:
    """A value of another JSON type than ``value``'s."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return 5
    return "not a container"


@pytest.mark.parametrize("cls", [pytest.param(c, id=kind) for kind, c in sorted(EVENT_TYPES.items())])
def test_a_damaged_field_is_refused_naming_it(cls):
    line = build(cls).to_dict()
    repaired = {f.name for f in dataclasses.fields(cls) if "repair" in f.metadata}
    for name in (n for n in line if n not in ("event", *repaired)):
        bad = {**line, name: _wrong(line[name])}
        with pytest.raises((ValueError, TypeError), match=rf"^{cls.KIND}\.{name}: expected"):
            cls.from_dict(bad)


def test_numbers_must_be_finite_and_in_range():
    good = k.Straggler(
        ts=TS,
        message="m",
        wait_ms=4.0,
        step_ms=20.0,
        share=0.2,
        cause="compute",
        pre_collective_ms={"worker:0": 10.0},
        relative_score=None,
    ).to_dict()
    for name, value in (("wait_ms", math.nan), ("step_ms", math.inf), ("share", -0.1), ("ts", -1.0), ("wait_ms", True)):
        with pytest.raises(ValueError, match=rf"^straggler\.{name}:"):
            k.Straggler.from_dict({**good, name: value})
    with pytest.raises(ValueError, match=r"^straggler\.pre_collective_ms\.worker:0: expected a number"):
        k.Straggler.from_dict({**good, "pre_collective_ms": {"worker:0": "10"}})
    with pytest.raises(ValueError, match=r"^task_spawned\.pid: expected a value in \[1"):
        k.TaskSpawned.from_dict({"ts": TS, "event": "task_spawned", "pid": 0})
    with pytest.raises(ValueError, match=r"^attempt_started\.attempt: expected an integer"):
        k.AttemptStarted.from_dict({"ts": TS, "event": "attempt_started", "attempt": 1.0})


def test_reading_rules_for_missing_unknown_and_foreign_records():
    # unknown keys ignored; a missing field that may be null reads as null; a missing default as its default
    ev = event_from_dict({"ts": TS, "event": "task_exited", "code": 0, "stopped": False, "new": [1]})
    assert ev == k.TaskExited(ts=TS, code=0, signal=None, signal_name=None, stopped=False, reason=None)
    assert event_from_dict({"ts": TS, "event": "teardown", "reason": "r", "grace_s": 1}).bounded is False
    for line, match in (
        ({"event": "warning", "message": "m"}, r"^warning\.ts: required field is missing"),
        ({"ts": TS, "event": "attempt_started"}, r"^attempt_started\.attempt: required field is missing"),
        ({"ts": TS, "event": "no_such_kind"}, r"unknown event kind"),
        ({"ts": TS, "event": ["warning"]}, r"unknown event kind"),
        ({"ts": TS, "event": "warning", "message": "m", "task": 3}, r"^warning\.task: expected"),
    ):
        with pytest.raises(ValueError, match=match):
            event_from_dict(line)
    with pytest.raises(TypeError):
        event_from_dict(["not", "an", "object"])
    with pytest.raises(ValueError, match="is a 'restart' event"):
        k.Teardown.from_dict({"ts": TS, "event": "restart", "reason": "r", "grace_s": 1})


def test_damaged_detail_is_dropped_rather_than_the_event():
    """Today's tolerance: goodput needs attempt_finished even when its root cause is damaged."""
    rc = event_from_dict({"ts": TS, "event": "attempt_finished", "attempt": 0, "state": "failed", "root_cause": "x"})
    assert rc.root_cause is None
    rc = event_from_dict(
        {
            "ts": TS,
            "event": "job_finished",
            "state": "failed",
            "wall_time_s": 1,
            "run_dir": "r",
            "root_cause": {"kind": "exit", "ts": "yesterday"},
        }
    )
    assert rc.root_cause is None
    ready = event_from_dict(
        {
            "ts": TS,
            "event": "task_ready",
            "hostname": "h",
            "pid": 9,
            "gpus": [
                {"name": "A100", "memory_mb": 81920},
                {"name": "V100", "memory_mb": "16 GB"},
                7,
                {"name": ["x"]},
                {"name": "T4"},
            ],
        }
    )
    assert ready.gpus == [{"name": "A100", "memory_mb": 81920}, {"name": "T4"}]
    assert event_from_dict({"ts": TS, "event": "task_ready", "hostname": "h", "pid": 9, "gpus": "x"}).gpus == []


def test_the_reader_skips_torn_damaged_and_foreign_lines(tmp_path):
    good = [build(cls) for cls in (k.JobStarted, k.AttemptStarted, k.Straggler, k.JobFinished)]
    path = tmp_path / "events.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(good[0].to_dict()) + "\n")
        f.write('{"ts": 1800000000.5, "event": "attempt_started", "attempt": "0"}\n')  # damaged
        f.write(json.dumps(good[1].to_dict()) + "\n")
        f.write("[1, 2]\n\x00\xff garbage\nnull\n" + "[" * 100_000 + "\n")  # foreign, binary, too deep
        f.write('{"ts": 1800000000.5, "event": "from_a_newer_launcher", "x": 1}\n')
        f.write(json.dumps(good[2].to_dict()) + "\n")
        f.write('{"ts": NaN, "event": "warning", "message": "m"}\n')
        f.write(json.dumps(good[3].to_dict()) + "\n")
        f.write('{"ts": 1800000000.5, "event": "warn')  # torn by a crash mid-write
    assert read_events(path) == good
    assert read_events(tmp_path / "missing.jsonl") == []
    assert parse_events([good[0].to_dict(), {"event": 1}]) == good[:1]


@pytest.mark.parametrize(("cls", "variant"), ALL)
def test_the_console_renders_every_kind(cls, variant):
    ev = build(cls, variant)
    text = describe(ev)
    assert text is None or (isinstance(text, str) and text)
    for color in (True, False):
        out = io.StringIO()
        ConsoleSink(out, color=color).handle(ev)
        prefix = "\x1b[1mtfcluster:\x1b[0m " if color else "tfcluster: "
        assert out.getvalue() == "" if text is None else out.getvalue().startswith(prefix) and text in out.getvalue()


def test_console_lines_and_colours():
    exited = dict(ts=TS, task="worker:1", host="h1", signal=None, signal_name=None, reason=None)
    assert describe(k.TaskExited(code=0, stopped=False, **exited)) == "worker:1 (h1) finished (exit 0)"
    assert describe(k.TaskExited(code=None, stopped=True, **exited)) is None
    out = io.StringIO()
    ConsoleSink(out, color=True).handle(k.TaskExited(code=3, stopped=False, **exited))
    assert out.getvalue() == "\x1b[1mtfcluster:\x1b[0m \x1b[31mworker:1 (h1) exited with code 3\x1b[0m\n"
    out = io.StringIO()
    ConsoleSink(out, color=True).handle(k.JobWarning(ts=TS, message="careful"))
    assert out.getvalue().endswith("\x1b[33mwarning: careful\x1b[0m\n")
    assert describe(k.AttemptStarted(ts=TS, attempt=0)) is None  # quiet kinds
    assert describe(k.Preflight(ts=TS, ok=True, summary="", findings=[], warnings=0)) is None


class _Keep:
    def __init__(self) -> None:
        self.events: list[BaseEvent] = []

    def handle(self, ev: BaseEvent) -> None:
        self.events.append(ev)

    def close(self) -> None:
        pass


def test_the_bus_takes_typed_events_only(tmp_path):
    keep = _Keep()
    bus = EventBus([keep, EventFileSink(tmp_path / "events.jsonl")])
    typed = k.Restart(ts=TS, attempt=1, max_attempts=3, reason="worker:1 exited with code 3")
    assert bus.emit(typed) is typed
    for bad in ("warning", {"event": "warning"}):
        with pytest.raises(TypeError):
            bus.emit(bad)  # type: ignore[arg-type]
    bus.close()
    assert keep.events == [typed]
    assert read_events(tmp_path / "events.jsonl") == [typed]


def test_every_emit_in_the_launcher_builds_a_typed_event():
    """No string-form ``emit("kind", ...)`` is left anywhere: each call site constructs its dataclass."""
    root = Path(__file__).resolve().parent.parent / "orchestrator"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, found
