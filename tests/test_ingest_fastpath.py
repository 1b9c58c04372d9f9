"""The launcher's ingest path, made cheaper (issue 33.4, h34), gives the outcomes of the code before.

From the socket to the heartbeats.jsonl line: ``SocketChannel.read`` (a short recv ends the read),
``Opener.feed`` and ``FrameDecoder.feed`` (records and frames cut from one ``bytes``), the message read
with its record in one pass (``protocol.plainread``, ``messages.RECORDED``) instead of converted back
(``record_of``), the session's checks by ``TYPE``. Each is compared here with what it stands in for:
the same record, the same line bytes, the same ``ProtocolError`` text for a hostile message, the same
plaintext and frames whichever way the bytes are cut.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from test_message_fastpath import BEAT, HOSTILE, PROFILE, VALID, checks_only

from orchestrator.backends.tcp import SocketChannel
from orchestrator.core import fastjson
from orchestrator.core.states import TaskState
from orchestrator.sinks.files import HeartbeatFile
from orchestrator.supervise.inputs import Received
from orchestrator.supervise.session import TaskSession, record_of
from worker_entry import protocol as p
from worker_entry.protocol.seal import Opener, Sealer, SealError


def old_record(m: p.Message) -> dict[str, Any]:
    """``record_of`` before: the message converted back to a dict."""
    return {k: v for k, v in p.Record.to_dict(m).items() if v is not None}


def outcome(payload: bytes, loads: Any = None) -> tuple[str, Any]:
    try:
        msg = p.parse_message(payload, loads)
    except p.ProtocolError as exc:
        return "error", (str(exc), exc.field)
    return "ok", (type(msg).__name__, msg.to_dict(), json.dumps(old_record(msg)), json.dumps(record_of(msg)))


@pytest.mark.parametrize("payload", [json.dumps(v).encode() for v in VALID] + HOSTILE)
def test_a_message_read_with_its_record_is_the_message_and_record_of_before(payload):
    with checks_only():
        before = outcome(payload)  # the field-by-field checks and json: the rules that decide
    after = outcome(payload, fastjson.loads)  # as the launcher reads: orjson, the plain readers
    assert after == before
    if after[0] == "ok":
        assert after[1][2] == after[1][3]  # the record kept equals the message converted back, key order too


def test_the_plain_reader_is_taken_for_a_usual_heartbeat_and_profile():
    for obj in (BEAT, PROFILE, {"type": "heartbeat", "seq": 0, "state": "waiting"}):
        msg = p.parse_message(json.dumps(obj).encode(), fastjson.loads)
        assert "_record" in msg.__dict__, obj["type"]  # not silently the old conversion every time
        assert record_of(msg) == old_record(msg)
    beat = p.parse_message(json.dumps(BEAT).encode(), fastjson.loads)
    rec = record_of(beat)
    assert rec["cpu_pct"] == 95.0 and type(rec["cpu_pct"]) is float  # an int for a float field, as to_dict
    assert rec["progress"]["loss"] == {"sum": 12.5, "steps": 100, "last": 0.1, "source": "callback"}
    assert rec["gpus"][0]["others"] == [{"pid": 9, "used_mb": None, "name": None, "visible": True}]
    assert "type" not in rec and "ts" in rec


def test_a_nested_record_missing_its_defaults_gets_them_as_to_dict_does():
    beat = {"type": "heartbeat", "seq": 3, "progress": {"steps": 5}, "host": {}}
    msg = p.parse_message(json.dumps(beat).encode(), fastjson.loads)
    assert "_record" in msg.__dict__
    assert record_of(msg) == old_record(msg)
    assert record_of(msg)["progress"] == {
        "steps": 5,
        "epoch": 0,
        "examples": None,
        "step_time_s": None,
        "phase": "train",
        "ts": 0.0,
        "loss": None,
    }


HOSTILE_BEATS = {
    "wrong type": (
        {**BEAT, "seq": "17"},
        "heartbeat.seq: expected an integer, got '17'",
    ),
    "a bool for an int": ({**BEAT, "threads": True}, "heartbeat.threads: expected an integer, got True"),
    "out of range": (
        {**BEAT, "cpu_pct": 1e8},
        "heartbeat.cpu_pct: expected a value in [0, 10000000.0], got 100000000.0",
    ),
    "nested out of range": (
        {**BEAT, "host": {"wait_pct": 170}},
        "heartbeat.host.wait_pct: expected a value in [0, 100], got 170",
    ),
    "nested wrong type": ({**BEAT, "progress": [1]}, "heartbeat.progress: expected a mapping, got [1]"),
    "too long": ({**BEAT, "state": "x" * 33}, "heartbeat.state: too long (33 > 32)"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BEATS))
def test_a_hostile_heartbeat_is_refused_with_the_same_error(name):
    obj, error = HOSTILE_BEATS[name]
    payload = json.dumps(obj).encode()
    for loads in (None, fastjson.loads):
        with pytest.raises(p.ProtocolError) as exc:
            p.parse_message(payload, loads)
        assert str(exc.value) == error


def test_extra_fields_and_repeated_keys_read_as_before():
    extra = p.parse_message(json.dumps({**BEAT, "task": "worker:9", "evil": [1] * 5}).encode(), fastjson.loads)
    assert "task" not in record_of(extra) and "evil" not in record_of(extra)
    repeated = p.parse_message(b'{"type":"heartbeat","seq":1,"seq":7}', fastjson.loads)
    assert repeated.seq == 7 and record_of(repeated) == {"seq": 7, "ts": 0.0}
    with pytest.raises(p.ProtocolError, match=r"heartbeat\.seq: expected a value in \[0, "):
        p.parse_message(b'{"type":"heartbeat","seq":1,"seq":-5}', fastjson.loads)


def test_the_heartbeats_jsonl_line_is_the_line_of_before(tmp_path: Path):
    msg = p.parse_message(json.dumps(BEAT).encode(), fastjson.loads)
    lines = []
    for name, record in (("before", old_record(msg)), ("after", record_of(msg))):
        out = HeartbeatFile(tmp_path / f"{name}.jsonl")
        out.write("worker:3", {**record, "attempt": 0})
        out.close()
        lines.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert lines[0] == lines[1] and lines[0].startswith(b'{"task":"worker:3","seq":17,')


def _records(n: int) -> tuple[bytes, list[bytes]]:
    sealer = Sealer(bytes(range(32)))
    plain = [b"record %d " % i * (i + 1) for i in range(n)]
    return b"".join(sealer.seal(x) for x in plain), plain


@pytest.mark.parametrize("cut", [1, 3, 17, 4096, 1 << 20])
def test_sealed_records_open_the_same_however_the_bytes_are_cut(cut):
    wire, plain = _records(40)
    opener = Opener(bytes(range(32)))
    got = b"".join(opener.feed(wire[at : at + cut]) for at in range(0, len(wire), cut))
    assert got == b"".join(plain) and opener.pending == 0


def test_a_malformed_or_forged_record_fails_at_once_even_after_a_partial_one():
    wire, _ = _records(2)
    opener = Opener(bytes(range(32)))
    opener.feed(wire[:10])  # a record begun
    with pytest.raises(SealError, match="failed authentication"):
        opener.feed(wire[10:-1] + bytes([wire[-1] ^ 1]))  # its rest, the last byte forged
    with pytest.raises(SealError):
        opener.feed(b"more")  # and everything after it
    bad = Opener(bytes(range(32)))
    with pytest.raises(SealError, match="malformed record"):
        bad.feed(b"\xff\xff\xff\xff")  # a header no record can have: refused before its bytes come


def _frames() -> bytes:
    return p.MARKER + b"".join(
        [p.log_frame(p.STDOUT, b"line %d\n" % i) for i in range(5)]
        + [p.msg_frame(BEAT), p.data_frame(b"x" * 70000), p.msg_frame(PROFILE)]
    )


@pytest.mark.parametrize("cut", [1, 2, 7, 1000, 1 << 20])
def test_frames_decode_the_same_however_the_bytes_are_cut(cut):
    wire = b"shell noise\n" + _frames()
    whole = p.FrameDecoder().feed(wire)
    decoder = p.FrameDecoder()
    pieces = [f for at in range(0, len(wire), cut) for f in decoder.feed(wire[at : at + cut])]
    assert [(f.type, f.stream, f.payload) for f in pieces] == [(f.type, f.stream, f.payload) for f in whole]
    assert len(whole) == 8 and all(type(f.payload) is bytes for f in whole) and decoder.pending == 0
    assert bytes(decoder.preamble) == b"shell noise\n"


def test_an_oversized_frame_fails_at_once_and_the_frames_before_it_still_come():
    good = p.msg_frame(BEAT)
    bad = p.HEADER.pack(p.T_MSG, 0, (1 << 20) + 1)
    decoder = p.FrameDecoder(synced=True)
    assert decoder.feed(good[:5]) == []
    assert [f.payload for f in decoder.feed(good[5:] + bad)] == [good[6:]]  # the valid frame first
    assert decoder.failed is not None and "oversized frame" in str(decoder.failed)
    partial = p.FrameDecoder(synced=True)
    partial.feed(b"\x02")  # a header begun: the oversized length is refused as soon as it is whole
    with pytest.raises(p.ProtocolError, match="oversized frame"):
        partial.feed(bad[1:])


def test_a_socket_channel_reads_what_came_then_the_eof_on_the_next_read():
    a, b = socket.socketpair()
    key_in = bytes(range(32))
    chan = SocketChannel(a, "peer", Sealer(bytes(32)), Opener(key_in))
    try:
        wire, plain = _records(3)
        b.sendall(wire)
        b.close()
        out, err, eof = chan.read()
        while not eof and out == b"":  # (a read that found nothing yet: the bytes are in flight)
            out, err, eof = chan.read()
        got = out
        while not eof:
            more, err, eof = chan.read()
            got += more
        assert got == b"".join(plain) and err == b"" and eof
    finally:
        chan.close()


def test_received_is_an_immutable_value():
    item = Received("worker:0", b"x", b"", False)
    assert (item.task, item.out, item.err, item.eof) == ("worker:0", b"x", b"", False)
    with pytest.raises(AttributeError):
        item.out = b"y"  # type: ignore[misc]


def test_the_session_checks_each_type_as_before():
    node = type("Node", (), {"task": "worker:0", "host": "h"})()
    s = TaskSession(node)  # type: ignore[arg-type]
    s.state = TaskState.STARTING
    beat = p.msg_frame({"type": "heartbeat", "seq": 1})
    items = s.receive(p.MARKER + beat, b"")
    assert [type(x).__name__ for x in items] == ["Violation"]
    assert items[0].error == "out of order: 'heartbeat' while starting"
    s = TaskSession(node)  # type: ignore[arg-type]
    s.state = TaskState.RUNNING
    files = {"type": "task_files", "task_dir": {"root": "/r"}}
    items = s.receive(p.MARKER + beat + p.msg_frame(files), b"")
    assert isinstance(items[0], p.Heartbeat) and s.heartbeat is items[0] and s.heartbeat_wall is not None
    assert items[1].error == "out of order: 'task_files' before 'exited', or twice"
