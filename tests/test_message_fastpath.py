"""The launcher's cheaper per-message path gives the outcomes of the plain one, valid or hostile.

Three shortcuts are checked against the code they stand in for: each record class's generated reader
(``schema._fast_reader``) against the field-by-field checks; the launcher's orjson decoding
(``parse_message(..., loads=fastjson.loads)``) against ``json``; ``fastjson.dumps`` (heartbeats.jsonl,
status.json) against ``json.dumps(default=str)``. Same value, or the same ``ProtocolError`` text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import fastjson
from orchestrator.sinks.files import HeartbeatFile
from orchestrator.supervise.session import record_of
from worker_entry import protocol as p
from worker_entry.protocol import schema

TS = 1_764_290_000.25
PROGRESS = {"steps": 1700, "epoch": 1, "examples": 108800, "step_time_s": 0.05, "phase": "train", "ts": TS}
HOST = {"interval_s": 1.0, "threads": 40, "run_ms": 950.0, "wait_ms": 5.0, "wait_pct": 0.5, "steal_pct": 0.0}
BEAT: dict[str, Any] = {
    "type": "heartbeat",
    "seq": 17,
    "ts": TS,
    "load1": 0.5,
    "state": "running",
    "cpu_pct": 95,  # an int for a float field: read as 95.0
    "cpu_s": 17.0,
    "rss_mb": 512.0,
    "threads": 40,
    "nproc": 1,
    "progress": {**PROGRESS, "loss": {"sum": 12.5, "steps": 100, "last": 0.1, "source": "callback"}},
    "host": HOST,
    "gpus": [{"index": 0, "util": 99.0, "mem_used_mb": 30000, "throttle": ["power"], "others": [{"pid": 9}]}],
}
PROFILE = {
    "type": "profile",
    "steps": 100,
    "ts": TS,
    "step_ms": 50.0,
    "collective_ms": 12.0,
    "allreduce_impl": "ring",
    "noise": {"steps": 100, "replicas": 4, "local_sq": 2.0, "total_sq": 1.0, "optimizer": "Adam"},
}
VALID = [
    BEAT,
    {"type": "heartbeat", "seq": 0, "state": "waiting"},
    PROFILE,
    {"type": "hello", "pid": 4, "remote_dir": "/r", "facts": {"hostname": "h", "gpus": [{"index": 0}], "cpus": 8}},
    {"type": "evaluation", "count": 1, "metrics": {"loss": 0.5, "accuracy": 1}},
    {"type": "exited", "code": 0, "stopped": False, "ended": TS},
    {"type": "started", "how": "strategy"},
    {"type": "task_files", "task_dir": {"root": "/r", "files": [{"path": "a", "size": 1}]}, "cleaned": ["x"]},
]


def _with(**changes: Any) -> bytes:
    return json.dumps({**BEAT, **changes}).encode()


HOSTILE: list[bytes] = [
    _with(seq="17"),  # wrong type
    _with(seq=True),  # a bool is no integer
    _with(seq=1.0),  # a float for an integer field
    _with(seq=-1),  # out of range
    _with(seq=10**30),  # past 64 bits: orjson reads it as a float, json as an int
    _with(seq=2**64 - 1),
    _with(cpu_pct=1e300),
    _with(cpu_pct=float("nan")),
    _with(cpu_pct=float("inf")),
    _with(state="x" * 33),  # a string over its limit
    _with(state=7),
    _with(state=None),  # allowed: optional
    _with(progress={**PROGRESS, "steps": "many"}),  # nested
    _with(progress={**PROGRESS, "loss": {"sum": 1.0}}),  # nested required field missing
    _with(progress=[1, 2]),
    _with(host={**HOST, "wait_pct": 170}),
    _with(gpus=[{"index": 2000}]),
    _with(gpus={"index": 0}),
    _with(gpus=[{"index": 0, "throttle": "power"}]),
    _with(task="worker:9", extra={"a": [1] * 10}),  # unknown fields: dropped
    json.dumps({k: v for k, v in BEAT.items() if k != "seq"}).encode(),  # required field missing
    json.dumps({**PROFILE, "allreduce_impl": "magic"}).encode(),
    json.dumps({**PROFILE, "noise": {**PROFILE["noise"], "replicas": 0}}).encode(),
    json.dumps({"type": "evaluation", "count": 1, "metrics": {"bad name!": 1.0}}).encode(),
    json.dumps({"type": "evaluation", "count": 1, "metrics": {"loss": "x"}}).encode(),
    json.dumps({"type": "hello", "pid": 4, "remote_dir": "/r", "facts": {"packages": {"a": 1}}}).encode(),
    b'{"type":"heartbeat","seq":1,"cpu_pct":NaN}',
    b'{"type":"heartbeat","seq":1,"cpu_pct":1e400}',
    b'{"type":"heartbeat","seq":1,"state":"\\ud800"}',
    b'\xef\xbb\xbf{"type":"heartbeat","seq":1}',
    b'{"type":"heartbeat","seq":1,"state":"\xff"}',
    b'{"type":"heartbeat","seq":1,"seq":-5}',  # a repeated key: the last one
    b'{"type":"heartbeat","seq":1' + b',"progress":{"steps":1,"loss":' * 40 + b"1" + b"}}" * 40 + b"}",
    b'{"type":"heartbeat","seq":1,"x":' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"type":["heartbeat"],"seq":1}',
    b'{"type":"warp","seq":1}',
    b"[1,2]",
    b"",
    b'"heartbeat"',
    json.dumps({**BEAT, "state": "é" * 5000}).encode(),  # a huge string
]


@contextlib.contextmanager
def checks_only() -> Iterator[None]:
    """Every record class read by its field-by-field checks alone: the code before the generated readers."""
    classes, stack = [], list(schema.Record.__subclasses__())
    while stack:
        cls = stack.pop()
        classes.append(cls)
        stack.extend(cls.__subclasses__())
    saved = {cls: cls.__dict__.get("_fast") for cls in classes}
    for cls in classes:
        cls._fast = lambda data, path, depth: schema._SLOW
    try:
        yield
    finally:
        for cls, fast in saved.items():
            if fast is None:
                with contextlib.suppress(AttributeError):
                    delattr(cls, "_fast")
            else:
                cls._fast = fast


def outcome(payload: bytes, loads: Any = None) -> tuple[str, Any]:
    try:
        msg = p.parse_message(payload, loads)
    except p.ProtocolError as exc:
        return "error", (str(exc), exc.field)
    return "ok", (type(msg).__name__, msg.to_dict())


@pytest.mark.parametrize("payload", [json.dumps(v).encode() for v in VALID] + HOSTILE)
def test_every_shortcut_gives_the_outcome_of_the_checks_and_json(payload):
    with checks_only():
        before = outcome(payload)
    assert outcome(payload) == before  # the generated readers
    assert outcome(payload, fastjson.loads) == before  # and orjson's decoding, as the launcher reads


def test_the_generated_reader_reads_a_usual_message_itself():
    """The shortcut is taken (not silently always the checks), with the checks' values and types."""
    for obj in VALID:
        cls = p.NODE_MESSAGES[obj["type"]]
        fast = schema._fast_reader(cls)(obj, "", 0)
        assert fast is not schema._SLOW, obj["type"]
        assert fast == cls._checked(obj, "", 0)
    beat = p.parse_message(json.dumps(BEAT).encode(), fastjson.loads)
    assert beat.cpu_pct == 95.0 and type(beat.cpu_pct) is float
    assert isinstance(beat.progress, p.Progress) and isinstance(beat.progress.loss, p.LossTotals)


def test_unknown_fields_are_dropped_from_the_message_and_its_record():
    msg = p.parse_message(_with(task="worker:9", extra=1), fastjson.loads)
    rec = record_of(msg)
    assert "task" not in rec and "extra" not in rec and not hasattr(msg, "extra")


DUMPED: list[Any] = [
    {"task": "worker:1", **BEAT, "none": None, "t": (1, 2), "u": "ü€\u2028"},
    {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},
    {"big": 10**30, "neg": -(2**70)},
    {"when": datetime.datetime(2026, 11, 27, 23, 0), "obj": object.__new__(p.Ping)},
    {"surrogate": "\ud800"},
    [1.5, 1e16, 1e-7, -0.0, 5e-324, 1.7976931348623157e308],
]


@pytest.mark.parametrize("obj", DUMPED)
@pytest.mark.parametrize("orjson", [True, False])
def test_fastjson_dumps_reads_back_as_json_dumps_default_str(obj, orjson, monkeypatch):
    if not orjson:
        monkeypatch.setattr(fastjson, "_orjson", None)
    data = fastjson.dumps(obj)
    assert isinstance(data, bytes) and b"\n" not in data
    assert json.loads(data) == json.loads(json.dumps(obj, default=str))


def test_fastjson_dumps_writes_a_dataclass_as_str_like_json():
    @dataclasses.dataclass
    class D:
        x: int = 1

    assert json.loads(fastjson.dumps({"d": D()})) == {"d": str(D())}


@pytest.mark.parametrize("payload", HOSTILE + [json.dumps(v).encode() for v in VALID])
@pytest.mark.parametrize("orjson", [True, False])
def test_fastjson_loads_is_json_loads(payload, orjson, monkeypatch):
    if not orjson:
        monkeypatch.setattr(fastjson, "_orjson", None)

    def result(f: Any) -> Any:
        try:
            return "ok", repr(f(payload))
        except (ValueError, RecursionError) as exc:
            return "error", type(exc).__name__

    plain, fast = result(json.loads), result(fastjson.loads)
    if b"10000000000000000000000000000" in payload and orjson:
        assert fast[0] == "ok"  # orjson: a float; parse_message then reads it again with json (above)
    else:
        assert fast == plain


def test_heartbeats_jsonl_holds_the_records_as_written(tmp_path: Path):
    f = HeartbeatFile(tmp_path / "heartbeats.jsonl")
    records = [record_of(p.parse_message(json.dumps(v).encode(), fastjson.loads)) for v in (BEAT, PROFILE)]
    for i, rec in enumerate(records):
        f.write(f"worker:{i}", {**rec, "attempt": 0})
    f.close()
    lines = (tmp_path / "heartbeats.jsonl").read_bytes().splitlines()
    assert [json.loads(x) for x in lines] == [{"task": f"worker:{i}", **r, "attempt": 0} for i, r in enumerate(records)]


@pytest.mark.parametrize("obj", VALID, ids=[v["type"] for v in VALID])
def test_to_dict_is_dataclasses_asdict_and_a_record_drops_only_the_type_and_nulls(obj):
    msg = p.parse_message(json.dumps(obj).encode())
    assert msg.to_dict() == {"type": msg.TYPE, **dataclasses.asdict(msg)}
    assert record_of(msg) == {k: v for k, v in dataclasses.asdict(msg).items() if v is not None}
