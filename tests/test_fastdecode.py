"""The launcher's msgspec reader of recorded messages (``orchestrator.core.fastdecode``) gives the outcomes
of the path before it (orjson, ``protocol.plainread``, the checks): the same message, the same record,
the same heartbeats.jsonl bytes for what is valid; the same ``ProtocolError`` text for what is not —
for the hand-picked hostile payloads and for a seeded generator's thousands of valid and near-valid
ones (values at and past every declared bound, huge integers, bools, strings and lists at and past
their limits, repeated and unknown keys, spacing, and byte-level mutations). Without msgspec the
launcher reads as before."""

from __future__ import annotations

import dataclasses
import json
import random
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from test_ingest_fastpath import HOSTILE_BEATS
from test_message_fastpath import BEAT, HOSTILE, PROFILE, VALID

from orchestrator.core import fastdecode, fastjson
from orchestrator.core.states import TaskState
from orchestrator.sinks.files import HeartbeatFile
from orchestrator.supervise.session import TaskSession, record_of
from worker_entry import protocol as p
from worker_entry.protocol import schema

READ = fastdecode.reader()
pytestmark = pytest.mark.skipif(READ is None, reason="msgspec is not installed")


def outcome(payload: bytes, read: Any) -> tuple[str, Any]:
    """What the launcher makes of a payload: the message, its record and its heartbeats.jsonl line, or the error."""
    try:
        msg = p.parse_message(payload, fastjson.loads, read)
    except p.ProtocolError as exc:
        return "error", (str(exc), exc.field)
    rec = record_of(msg)
    line = fastjson.dumps({"task": "worker:1", **rec, "attempt": 0})
    return "ok", (type(msg).__name__, msg, json.dumps(msg.to_dict()), json.dumps(rec), line)


def same(payload: bytes) -> tuple[str, Any]:
    before, after = outcome(payload, None), outcome(payload, READ)
    assert after == before, payload[:300]
    return after


PROBES = [
    b'{"type":"heartbeat","seq":1,"seq":7}',
    b'{"type":"heartbeat","seq":-5,"seq":7}',
    b'{"type":"hello","type":"heartbeat","seq":1}',
    b'{"type":"heartbeat","type":"hello","seq":1}',
    b'{"type":"heartbeat","type":"profile","seq":1,"steps":2}',
    b'{"seq":1,"type":"heartbeat"}',
    b'{"type":"heartbeat","seq":1e2}',
    b'{"type":"heartbeat","seq":-0}',
    b'{"type":"heartbeat","seq":1,"ts":-0}',
    b'{"type":"heartbeat","seq":1,"ts":-0.0}',
    b'{"type":"heartbeat","seq":1,"ts":-1e-400}',
    b'{"type":"heartbeat","seq":01}',
    b'{"type":"heartbeat","seq":1,"x":NaN}',
    b'{"type":"heartbeat","seq":1,"x":-Infinity}',
    b'{"type":"heartbeat","seq":1,"x":1e400}',
    b'{"type":"heartbeat","seq":1,"x":"\xff"}',  # invalid UTF-8 where msgspec skips: json refuses it
    b'{"type":"heartbeat","seq":1,"x":"\xc0\xaf"}',
    b'{"type":"heartbeat","seq":1,"x":"\xed\xa0\x80"}',  # an encoded surrogate: json reads it
    b'{"type":"heartbeat","seq":1,"state":"\xed\xa0\x80"}',
    b'{"type":"heartbeat","seq":1,"x":"\\ud800"}',
    b'{"type":"heartbeat","seq":1,"state":"\\ud83d\\ude00"}',
    b'{"type":"heartbeat","seq":1,"state":"\\u0000\\u2028"}',
    b'{"type":"heartbeat","seq":1,"x":"a\x01"}',
    b'{"type":"heartbeat","seq":1,"x":1 2}',
    b'\x0c{"type":"heartbeat","seq":1}',
    b'{"type":"heartbeat","seq":1}\r\n\t ',
    b'{"type":"heartbeat","seq":1}{}',
    b'{"ty\\u0070e":"heart\\u0062eat","s\\u0065q":1}',
    b'{"type":"heartbeat","seq":1,"x":' + b"[" * 199 + b"]" * 199 + b"}",
    b'{"type":"heartbeat","seq":1,"x":' + b"[" * 198 + b"]" * 198 + b"}",
    b'{"type":"heartbeat","seq":1,"x":' + b"[" * 199 + b"}",  # short, unbalanced: refused either way
    b'{"type":"heartbeat","seq":1,"x":"' + b"[" * 300 + b'"}',  # brackets in a string: counted, harmless
    b'{"type":"heartbeat","seq":1,"ts":9007199254740993}',
    b'{"type":"profile","steps":1,"batch_p50":9007199254740993}',  # rounds onto the bound as a float
    b'{"type":"profile","steps":1,"batch_p50":9007199254740992}',
    b'{"type":"profile","steps":1,"batch_p50":9007199254740992.0}',
    b'{"type":"profile","steps":1,"noise":{"steps":1,"replicas":1,"local_sq":1,"total_sq":0,"cov":-1e77}}',
    b'{"type":"heartbeat","seq":9007199254740992,"gpus":[{"index":1024,"temp_c":-100}]}',
    b'{"type":"heartbeat","seq":1,"progress":{"steps":1},"progress":null}',
    b'{"type":"heartbeat","seq":1,"gpus":[{"index":0,"throttle":' + json.dumps(["a"] * 17).encode() + b"}]}",
    b'{"type":"heartbeat","seq":1,"gpus":[{"index":0,"others":' + json.dumps([{"pid": 1}] * 33).encode() + b"}]}",
    b'{"type":"heartbeat","seq":1,"state":"' + "😀".encode() * 32 + b'"}',
    b'{"type":"heartbeat","seq":1,"state":"' + "😀".encode() * 33 + b'"}',
    b'{"type":"heartbeat","seq":18446744073709551616}',
    b'{"type":"exited","code":0}',
]


#: decimal texts a float parser may round differently from ``float()`` (halfway cases, long digits, subnormals)
NUMBERS = [
    "0.1000000000000000055511151231257827",
    "1.00000000000000011102230246251565404236316680908203125",
    "1.00000000000000011102230246251565404236316680908203126",
    "2.4703282292062327e-324",
    "2.4703282292062328e-324",
    "4.9406564584124654e-324",
    "2.2250738585072011e-308",
    "2.2250738585072012e-308",
    "123456789012.345678901234567890",
    "999999999999.99999999",
    "1000000000000.0000000001",
    "1e12",
    "1E+12",
    "0.0000000000000000000000000000000000000000001e40",
    "7.038531e-26",
    "9007199254740991",
    "9007199254740991.0",
    "9007199254740991.4",
    "-0.0",
    "0e0",
    "3.14159265358979323846264338327950288419716939937510",
]


@pytest.mark.parametrize("text", NUMBERS)
def test_a_number_reads_as_before(text):
    for field in ("cpu_s", "load1"):
        same(b'{"type":"heartbeat","seq":1,"%s":%s}' % (field.encode(), text.encode()))
    same(b'{"type":"profile","steps":1,"batch_p50":%s,"grad_bytes":%s}' % (text.encode(), text.encode()))


@pytest.mark.parametrize("payload", [json.dumps(v).encode() for v in VALID] + HOSTILE + PROBES)
def test_a_payload_reads_as_before(payload):
    same(payload)


@pytest.mark.parametrize("name", sorted(HOSTILE_BEATS))
def test_a_hostile_heartbeat_gets_the_same_error(name):
    obj, error = HOSTILE_BEATS[name]
    with pytest.raises(p.ProtocolError) as exc:
        p.parse_message(json.dumps(obj).encode(), fastjson.loads, READ)
    assert str(exc.value) == error


def test_the_usual_messages_are_read_by_msgspec_itself():
    for obj in (BEAT, PROFILE, {"type": "heartbeat", "seq": 0, "state": "waiting"}):
        got = READ(json.dumps(obj).encode())
        assert got is not None, obj["type"]  # not silently the old path every time
        msg, rec = got
        assert msg == p.parse_message(json.dumps(obj).encode(), fastjson.loads)
        assert json.dumps(rec) == json.dumps({k: v for k, v in p.Record.to_dict(msg).items() if v is not None})
    msg, rec = READ(json.dumps(BEAT).encode())
    assert type(msg.cpu_pct) is float and type(rec["cpu_pct"]) is float  # an int for a float field
    assert isinstance(msg.gpus[0].others[0], p.GpuProcess) and rec["gpus"][0]["others"][0]["visible"] is True
    assert READ(json.dumps(VALID[3]).encode()) is None  # a hello: not recorded, read as before
    before = p.parse_message(json.dumps(BEAT).encode(), fastjson.loads)
    after = p.parse_message(json.dumps(BEAT).encode(), fastjson.loads, READ)
    assert list(vars(after)) == list(vars(before)) and list(vars(after.progress)) == list(vars(before.progress))


def test_a_class_it_cannot_translate_is_left_to_the_protocol():
    assert fastdecode.reader(frozenset({p.Evaluation, p.Hello})) is None  # __post_init__, default_factory
    only = fastdecode.reader(frozenset({p.Evaluation, p.Heartbeat}))
    assert only is not None and only(json.dumps(BEAT).encode()) is not None
    assert only(json.dumps(PROFILE).encode()) is None


def test_the_heartbeats_jsonl_line_is_the_line_of_before(tmp_path: Path):
    lines = []
    for name, read in (("before", None), ("after", READ)):
        out = HeartbeatFile(tmp_path / f"{name}.jsonl")
        for obj in (BEAT, PROFILE):
            out.write(
                "worker:3", {**record_of(p.parse_message(json.dumps(obj).encode(), fastjson.loads, read)), "attempt": 0}
            )
        out.close()
        lines.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert lines[0] == lines[1] and lines[0].count(b"\n") == 2


# --------------------------------------------------------------------------- a seeded generator

_CHARS = 'abz09 _-é€😀\u2028"\\/\x00\x1f\x7f'
_BIG = [2**31, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1]


def _number(rng: random.Random, tp: Any, meta: dict[str, Any], bad: float) -> Any:
    lo = meta.get("lo") if meta.get("lo") is not None else -(2**63)
    hi = meta.get("hi") if meta.get("hi") is not None else 2**63
    roll = rng.random()
    if roll < bad:  # past a bound, huge, or not a number of the field's type
        edge = rng.choice([lo, hi])
        near = [edge + 1, edge - 1, edge * (1 + 1e-16), edge + 0.5, *_BIG, True, "1", [1], 1e308, 1.5]
        return rng.choice(near) * rng.choice([1, 1, -1]) if rng.random() < 0.3 else rng.choice(near)
    if roll < 0.8:
        v = rng.uniform(float(lo), min(float(hi), 1e15))
        return int(v) if tp is int or rng.random() < 0.3 else v
    edge = rng.choice([lo, hi, 0])  # at a bound, exactly
    return rng.choice([edge, float(edge), -0.0, 5e-324, 0.1 + 0.2]) if tp is float else edge


def _string(rng: random.Random, limit: int, bad: float) -> Any:
    if rng.random() < bad:
        return rng.choice([limit + 1, limit + 2, 7, None, []]) if rng.random() < 0.5 else "x" * (limit + 1)
    n = rng.choice([0, 1, limit - 1, limit]) if rng.random() < 0.5 else rng.randint(0, min(limit, 40))
    return "".join(rng.choice(_CHARS) for _ in range(min(n, 24))) + "a" * max(n - 24, 0)


def _value(rng: random.Random, tp: Any, meta: dict[str, Any], bad: float) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if rng.random() < 0.3:
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    elif rng.random() < bad / 4:
        return None  # a null for a field that takes none
    if origin is typing.Literal:
        return rng.choice([*typing.get_args(tp), "x", 1, True] if rng.random() < bad else typing.get_args(tp))
    if origin is list:
        limit = meta.get("max_len") or 4096
        n = rng.choice([0, 1, 2, limit] + [limit + 1] * (rng.random() < bad)) if limit <= 32 else rng.randint(0, 3)
        return [_value(rng, typing.get_args(tp)[0], {}, bad) for _ in range(n)]
    if isinstance(tp, type) and issubclass(tp, schema.Record):
        return _record(rng, tp, bad) if rng.random() >= bad else rng.choice([[1], "x", 3])
    if tp is bool:
        return rng.choice([True, False] if rng.random() >= bad else [0, 1, "true", None])
    if tp is str:
        return _string(rng, meta.get("max_len") or schema.STR, bad)
    return _number(rng, tp, meta, bad)


def _record(rng: random.Random, cls: type, bad: float) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if rng.random() < (bad / 4 if required else 0.35):
            continue  # missing
        out[f.name] = _value(rng, hints[f.name], dict(f.metadata), bad)
    if rng.random() < 0.2:
        out[rng.choice(["task", "extra", "évil"])] = rng.choice([1, [1, {"a": None}], "x" * 10, 1e400, "\ud800"])
    return out


def _payload(rng: random.Random) -> bytes:
    cls = rng.choice([p.Heartbeat, p.Profile])
    obj = {"type": cls.TYPE, **_record(rng, cls, rng.choice([0.0, 0.0, 0.01, 0.05]))}
    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
    if rng.random() < 0.15 and len(obj) > 1:  # a repeated key: the last one counts
        key = rng.choice(list(obj))
        text = text[:-1] + f', "{key}": {json.dumps(_value(rng, float, {"lo": 0, "hi": 10}, 0.2))}}}'
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:  # bytes mutated: whatever decodes must still read the same
        data = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            data[at : at + rng.randint(0, 2)] = bytes([rng.randrange(256)]) * rng.randint(0, 2)
        data = bytes(data)
    return data


def test_seeded_payloads_read_as_before():
    rng = random.Random(33)
    taken = {"ok": 0, "error": 0}
    fast = 0
    for _ in range(2000):
        payload = _payload(rng)
        kind, _ = same(payload)
        taken[kind] += 1
        fast += READ(payload) is not None
    assert min(taken.values()) > 300 and fast > 500  # both outcomes, and msgspec's own path, well exercised


def test_without_msgspec_the_launcher_reads_as_before(monkeypatch):
    monkeypatch.setattr(fastdecode, "msgspec", None)
    assert fastdecode.reader() is None
    monkeypatch.setattr(fastdecode, "READ", None)
    node = type("Node", (), {"task": "worker:0", "host": "h"})()
    s = TaskSession(node)  # type: ignore[arg-type]
    s.state = TaskState.RUNNING
    items = s.receive(p.MARKER + p.msg_frame(BEAT) + p.msg_frame(PROFILE), b"")
    assert [type(x).__name__ for x in items] == ["Heartbeat", "Profile"]
    assert json.dumps(record_of(items[0])) == json.dumps(
        {k: v for k, v in p.Record.to_dict(items[0]).items() if v is not None}
    )


def test_the_session_reads_with_msgspec_when_it_is_there(monkeypatch):
    calls = []

    def spy(payload: bytes) -> Any:
        calls.append(payload)
        return READ(payload)

    monkeypatch.setattr(fastdecode, "READ", spy)
    node = type("Node", (), {"task": "worker:0", "host": "h"})()
    s = TaskSession(node)  # type: ignore[arg-type]
    s.state = TaskState.RUNNING
    items = s.receive(p.MARKER + p.msg_frame(BEAT), b"")
    assert len(calls) == 1 and isinstance(items[0], p.Heartbeat) and s.heartbeat is items[0]
