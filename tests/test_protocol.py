"""worker_entry.protocol: frames, the node config and every message, validated on receipt."""

from __future__ import annotations

import json

import pytest

from worker_entry import protocol as p


def test_frame_decoder_skips_shell_noise_and_reassembles():
    stream = (
        b"Welcome to host!\nlast login...\n" + p.MARKER + p.msg_frame({"type": "hello"}) + p.log_frame(1, b"a\nb\n")
    )
    dec = p.FrameDecoder()
    frames = []
    for i in range(0, len(stream), 3):  # byte-dribbled, as a slow network would
        frames += dec.feed(stream[i : i + 3])
    assert bytes(dec.preamble) == b"Welcome to host!\nlast login...\n"
    assert [f.type for f in frames] == [p.T_MSG, p.T_LOG]
    assert json.loads(frames[0].payload) == {"type": "hello"} and frames[1].payload == b"a\nb\n"


def test_frame_decoder_rejects_garbage_after_sync_and_then_drops_everything():
    dec = p.FrameDecoder()
    with pytest.raises(p.ProtocolError, match="bad frame header"):
        dec.feed(p.MARKER + b"\xff\x00\x00\x00\x00\x10")
    assert dec.feed(p.log_frame(1, b"more\n")) == []  # poisoned: nothing more is decoded or kept
    assert dec.pending == 0


def test_frames_before_a_bad_header_are_delivered_then_the_error():
    dec = p.FrameDecoder(synced=True)
    frames = dec.feed(p.log_frame(1, b"ok\n") + p.HEADER.pack(p.T_MSG, 0, 2 << 20))
    assert [f.payload for f in frames] == [b"ok\n"]
    with pytest.raises(p.ProtocolError, match="oversized frame"):
        dec.raise_pending()


def test_an_oversized_header_is_refused_before_its_payload_arrives():
    dec = p.FrameDecoder(synced=True)
    with pytest.raises(p.ProtocolError, match="oversized"):
        dec.feed(p.HEADER.pack(p.T_LOG, 1, p.MAX_PAYLOAD[p.T_LOG] + 1))


def test_the_preamble_before_the_marker_is_bounded():
    dec = p.FrameDecoder()
    for _ in range(100):
        dec.feed(b"x" * 10_000)  # a login shell that never stops talking
    assert len(dec.preamble) <= p.MAX_PREAMBLE
    assert dec.pending < len(p.MARKER)


@pytest.mark.parametrize(
    "msg",
    [
        p.Hello(
            pid=7,
            remote_dir="/r",
            facts=p.NodeFacts(hostname="h", gpus=[p.GpuInfo(0, "H100", 81559)], cpus=2, boot_id="a435aaee-81a0"),
            task=p.TaskRef("chief", 0),
        ),
        p.Heartbeat(
            seq=3,
            ts=1.5,
            state="running",
            cpu_pct=12.5,
            rss_mb=3.0,
            gpus=[p.GpuSample(0, 97.0, 10)],
            progress=p.Progress(steps=10, examples=320, ts=2.0),
        ),
        p.Spawned(pid=9),
        p.Started(how="tf_server"),
        p.StrategyInfo(communication="ring", timeout_s=None),
        p.Profile(steps=12, step_ms=14.0, pre_collective_ms=2.0, input_ms=1.0, compute_ms=1.0, collective_ms=9.0),
        p.Stopping(reason="stopped by the launcher"),
        p.Exited(code=None, signal=9, signal_name="SIGKILL", stopped=True, ended=3.0),
    ],
)
def test_every_node_message_round_trips(msg):
    frame = p.msg_frame(msg)
    (fr,) = p.FrameDecoder(synced=True).feed(frame)
    assert p.parse_message(fr.payload) == msg


def test_commands_round_trip_and_accept_the_old_spelling():
    for cmd in (p.Go(), p.Ping(), p.Stop(grace_s=2.0, reason="r", signal=2)):
        assert p.parse_command(p.command_line(cmd)) == cmd
    assert p.parse_command(b'{"op":"stop","grace_s":1}') == p.Stop(grace_s=1.0)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b'{"type":"hello","pid":"1","remote_dir":"/"}', "hello.pid: expected an integer, got '1'"),
        (b'{"type":"hello","remote_dir":"/"}', "hello.pid: required field is missing"),
        (b'{"type":"heartbeat","seq":1,"cpu_pct":NaN}', "heartbeat.cpu_pct: expected a number"),
        (
            b'{"type":"heartbeat","seq":1,"gpus":[{"index":0,"util":101}]}',
            "heartbeat.gpus[0].util: expected a value in [0, 100]",
        ),
        (b'{"type":"exited","code":true}', "exited.code: expected an integer, got True"),
        (b'{"type":"exited","code":256}', "exited.code: expected a value in [0, 255]"),
        (b'{"type":"started","how":"magic"}', "started.how: expected one of"),
        (b'{"type":"stopping","reason":"' + b"x" * 70000 + b'"}', "stopping.reason: too long"),
        (b'{"type":"heartbeat","seq":1,"progress":[]}', "heartbeat.progress: expected a mapping"),
        (
            b'{"type":"hello","pid":1,"remote_dir":"/","facts":{"boot_id":"' + b"x" * 65 + b'"}}',
            "hello.facts.boot_id: too long",
        ),
        (b'{"type":"nope"}', "unknown message type 'nope'"),
        (b'"hello"', "must be a JSON object"),
        (b"[" * 100000, "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_bad_messages_are_one_protocol_error_naming_the_field(payload, error):
    with pytest.raises(p.ProtocolError) as exc:
        p.parse_message(payload)
    assert error in str(exc.value)


def test_unknown_fields_are_ignored_for_newer_nodes():
    msg = p.parse_message(b'{"type":"spawned","pid":4,"cgroup":"/sys/fs/cgroup/x"}')
    assert msg == p.Spawned(pid=4)


def test_deeply_nested_values_are_refused():
    nested: dict = {"steps": 1}
    for _ in range(40):
        nested = {"x": nested}
    payload = json.dumps({"type": "hello", "pid": 1, "remote_dir": "/", "facts": {"packages": nested}}).encode()
    with pytest.raises(p.ProtocolError):
        p.parse_message(payload)


def test_node_config_round_trips_and_validates():
    config = p.NodeConfig(argv=["python3", "train.py"], remote_dir="~/r", env={"A": "1"}, tf_port=2222)
    assert p.NodeConfig.parse_line(p.command_line(config)) == config
    with pytest.raises(p.ProtocolError, match="tf_port"):
        p.NodeConfig.parse_line(b'{"argv":["x"],"remote_dir":"/r","tf_port":70000}')
    with pytest.raises(p.ProtocolError, match=r"env\.A: expected a string"):
        p.NodeConfig.parse_line(b'{"argv":["x"],"remote_dir":"/r","env":{"A":1}}')


def test_a_manifest_reply_is_validated():
    good = b'{"manifests":[{"root":"/c","exists":true,"files":[{"path":"a/b","size":3,"mtime_ns":1}]}]}'
    reply = p.ManifestReply.parse_line(good)
    assert reply.manifests[0].files[0] == p.FileEntry("a/b", 3, 1)
    with pytest.raises(p.ProtocolError, match=r"manifest\.manifests\[0\]\.files\[0\]\.size"):
        p.ManifestReply.parse_line(b'{"manifests":[{"root":"/c","files":[{"path":"a","size":-1}]}]}')


def test_the_env_names_are_importable_without_the_message_classes():
    import subprocess
    import sys

    code = (
        "import sys; from worker_entry.protocol.env import Env; "
        "print(Env.INSTRUMENT, 'worker_entry.protocol.messages' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["TFCLUSTER_INSTRUMENT", "False"]


@pytest.mark.parametrize(
    ("bad", "where", "why"),
    [
        (7, r"cluster\.worker\[2\]", "a string"),
        (None, r"cluster\.worker\[2\]", "a string"),
        ("h" * 4097, r"cluster\.worker\[2\]", "too long"),
        (["a:1"], r"cluster\.worker\[2\]", "a string"),
    ],
)
def test_a_clusters_endpoints_are_checked_in_one_pass_and_a_bad_one_is_still_named(bad, where, why):
    """A list of strings (a 16,384-task cluster's endpoints) is checked at C speed; one that fails is
    named by its place, exactly as the item-by-item check named it."""
    good = {"worker": [f"w{i}:2222" for i in range(4)]}
    config = p.NodeConfig(argv=["t"], remote_dir="/r", task=p.TaskRef("worker", 1), cluster=good)
    back = p.NodeConfig.parse_line(p.command_line(config))
    assert back.cluster == good and type(back.cluster["worker"]) is list
    line = json.loads(p.command_line(config))
    line["cluster"]["worker"][2] = bad
    with pytest.raises(p.ProtocolError, match=f"{where}.*{why}|{why}.*{where}"):
        p.NodeConfig.parse_line(json.dumps(line).encode() + b"\n")
