"""The smaller holes of issue 31, item 11, through the real code (unit tier: real sockets on loopback,
the real connect-back server and node, the real redaction and metrics collector).

- the handshake's proof names the attempt: a late dialer of an earlier attempt is refused (signed,
  so it stops) and cannot take the rank's place in this one;
- a hello of another protocol version is not final: the node keeps dialing;
- a restart's TF_CONFIG uses a node's endpoint only when it is the node's own address;
- redaction catches every case the issue lists, and leaves ordinary arguments alone;
- node-chosen label values cannot grow the metric series without bound.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time

import pytest

from orchestrator.backends.tcp import ConnectBackServer
from orchestrator.core.redact import redact_argv, redact_env, secret_values
from orchestrator.sinks.metrics import MAX_LABEL_VALUES, JobMetrics, _Collector
from orchestrator.supervise.placement import endpoint_problem
from worker_entry import protocol as p
from worker_entry.agent.modes.connect import HandshakeError, Refused, connect_back

SECRET = b"s" * 32


def _server(attempt: int):
    srv = ConnectBackServer(SECRET, bind=("127.0.0.1", 0))
    got: list = []
    config = p.NodeConfig(argv=["true"], remote_dir="/tmp/x", attempt=attempt)
    srv.expect({0: ("worker:0", config)}, lambda task, chan: got.append((task, chan)))
    return srv, got


def test_a_late_dialer_of_an_earlier_attempt_cannot_take_the_new_attempts_place():
    srv, got = _server(attempt=1)
    try:
        with pytest.raises(Refused, match="rank 0 dialed for attempt 0, this is attempt 1"):
            connect_back(("127.0.0.1", srv.port), SECRET, 0, deadline_s=5, attempt=0)
        link = connect_back(("127.0.0.1", srv.port), SECRET, 0, deadline_s=5, attempt=1)  # the slot is still free
        assert p.NodeConfig.parse_line(link.config_line).attempt == 1
        link.sock.close()
    finally:
        srv.close()
        for _, chan in got:
            chan.close()


def test_a_proof_for_one_attempt_does_not_verify_for_another():
    from worker_entry.protocol import handshake as hs

    line = hs.answer(SECRET, 3, "a" * 64, "b" * 64, attempt=2)
    rank, attempt, nonce, their = hs.parse_answer(line[:-1])
    assert (rank, attempt) == (3, 2)
    assert hs.same_mac(hs.mac(SECRET, b"node", "a" * 64, nonce, rank, attempt=2), their)
    assert not hs.same_mac(hs.mac(SECRET, b"node", "a" * 64, nonce, rank, attempt=1), their)


def test_one_hello_of_another_version_does_not_make_a_node_give_up():
    """A stranger answers the node's first dial with a hello of another version; the node dials again
    and reaches the real supervisor (before: Refused at once, the task never started)."""
    srv, got = _server(attempt=0)
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    relays: list[threading.Thread] = []

    def front() -> None:
        first = True
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            if first:
                first = False
                with conn:
                    conn.sendall(json.dumps({"tfcluster": "connect", "v": 99, "nonce": "c" * 64}).encode() + b"\n")
                continue
            t = threading.Thread(target=_relay, args=(conn, ("127.0.0.1", srv.port)), daemon=True)
            t.start()
            relays.append(t)

    threading.Thread(target=front, daemon=True).start()
    try:
        link = connect_back(("127.0.0.1", port), SECRET, 0, deadline_s=20)
        assert p.NodeConfig.parse_line(link.config_line).argv == ["true"]
        link.sock.close()
    finally:
        lsock.close()
        srv.close()
        for _, chan in got:
            chan.close()
        for t in relays:
            t.join(5)


def test_a_node_that_only_ever_meets_another_version_says_so_at_its_deadline():
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def front() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(json.dumps({"tfcluster": "connect", "v": 99, "nonce": "c" * 64}).encode() + b"\n")

    threading.Thread(target=front, daemon=True).start()
    try:
        with pytest.raises(HandshakeError, match="speaks connect-back version '99'"):
            connect_back(("127.0.0.1", port), SECRET, 0, deadline_s=1.5)
    finally:
        lsock.close()


def _relay(conn: socket.socket, target: tuple[str, int]) -> None:
    with conn, socket.create_connection(target) as up:
        sel = selectors.DefaultSelector()
        sel.register(conn, selectors.EVENT_READ, up)
        sel.register(up, selectors.EVENT_READ, conn)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            for key, _ in sel.select(0.5):
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)


class _Chan:
    def __init__(self, peer):
        self.peer = peer


def test_a_restarts_tf_config_uses_only_a_nodes_own_address():
    assert endpoint_problem("127.0.0.5:2222", _Chan("127.0.0.5:40000")) is None
    assert endpoint_problem("localhost:2222", _Chan("127.0.0.1:40000")) is None
    assert endpoint_problem("[::ffff:10.1.2.3]:2222", _Chan("10.1.2.3:1")) is None
    why = endpoint_problem("10.9.9.9:2222", _Chan("127.0.0.5:40000"))
    assert "listens at 10.9.9.9:2222, which is not the node's own address (it connected from 127.0.0.5)" in why
    assert endpoint_problem("attacker.invalid:2222", _Chan("127.0.0.5:40000")) is not None
    assert endpoint_problem("10.9.9.9:2222", object()) is None  # an SSH channel: TF_CONFIG comes from the plan


@pytest.mark.parametrize(
    ("argv", "secret", "shown"),
    [
        (["curl", "-u", "alice:s3cretpw", "https://api.example.com"], "s3cretpw", "alice:<redacted>"),
        (["curl", "-H", "X-Api-Key: abcdef123456", "https://x"], "abcdef123456", "X-Api-Key: <redacted>"),
        (["mysql", "-pS3cretPW", "-h", "db"], "S3cretPW", "-p<redacted>"),
        (
            ["bash", "-c", "echo hunter2pass | docker login -u me --password-stdin registry.io"],
            "hunter2pass",
            "echo <redacted> | docker login -u me --password-stdin registry.io",
        ),
        (
            ["python", "t.py", "--note", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_Xg"],
            "dozjgNryP4J3jVmNHl0w5N_Xg",
            "<redacted>",
        ),
        (["python", "t.py", "--cfg", '{"password": "pw123", "user": "bob"}'], "pw123", '"user": "bob"'),
        (["bash", "-c", "mysql -uroot -pS3cretPW -e 'select 1'"], "S3cretPW", "mysql -uroot -p<redacted>"),
    ],
)
def test_every_case_of_the_issue_is_redacted(argv, secret, shown):
    out = redact_argv(argv)
    assert secret not in " ".join(out) and shown in " ".join(out), out
    assert secret in secret_values({}, argv) or any(secret in v for v in secret_values({}, argv))


def test_credentials_in_values_under_innocuous_names_are_redacted():
    env = {
        "NETRC_TEXT": "machine api.example.com login bob password hunter2",
        "BLOB": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----",
        "NOTIFY": "https://hooks.slack.com/services/T0001/B0002/XXXXXXXXXXXXXXXXXXXX",
    }
    out = redact_env(env)
    assert out["NETRC_TEXT"] == "machine api.example.com login bob password <redacted>"
    assert "b3BlbnNzaC1rZXk" not in out["BLOB"] and out["BLOB"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert out["NOTIFY"] == "https://hooks.slack.com/services/<redacted>"


def test_ordinary_arguments_are_left_alone():
    plain = [
        ["python", "-u", "train.py", "--epochs", "3", "-p", "8080", "--batch-size", "64"],
        ["find", ".", "-name", "*.py", "-print"],
        ["bash", "-c", "echo hello | grep h; sort -u file.txt"],
        ["python", "t.py", "key:value", "time: 12", "--lr", "0.1"],
        ["python", "t.py", "--message", "the password policy is documented"],
    ]
    for argv in plain:
        assert redact_argv(argv) == argv
    assert redact_env({"PATH": "/usr/bin:/bin", "MSG": "reset your password here"}) == {
        "PATH": "/usr/bin:/bin",
        "MSG": "reset your password here",
    }


def test_node_chosen_label_values_cannot_grow_the_series_without_bound():
    """A node that names a new clock-event reason and a new evaluation metric at every heartbeat."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    m = JobMetrics("j", "r")
    reg = CollectorRegistry()
    reg.register(_Collector(m))
    series: set[tuple] = set()
    for beat in range(200):
        gpus = [{"index": beat % 1024, "util": 50, "throttle": [f"reason-{beat}"]}]
        evaluation = {"evaluations": beat, "metrics": {f"m{beat}": 0.5}}
        m.update({"state": "running", "tasks": {"worker:0": {"host": "h", "gpus": gpus, "evaluation": evaluation}}})
        text = generate_latest(reg).decode()
        for line in text.splitlines():
            if line.startswith(("tfcluster_task_gpu_clock_event{", "tfcluster_task_evaluation_metric{")):
                series.add(line.rsplit(" ", 1)[0])
            if line.startswith("tfcluster_task_gpu_utilization_ratio{"):
                series.add(line.rsplit(" ", 1)[0])
    assert len(series) <= 3 * MAX_LABEL_VALUES, len(series)
    assert m.labels.dropped > 0
    assert 'tfcluster_metric_labels_dropped_total{job="j"}' in generate_latest(reg).decode()


def test_the_input_queue_is_bounded_in_bytes_not_only_in_reads():
    """1,024 reads of a flooding task held 576 MiB; now a put waits once 32 MiB are queued."""
    import queue

    from orchestrator.supervise.inputs import QUEUE_BYTES, InputQueue, Received

    q = InputQueue()
    chunk = b"x" * (1 << 20)
    puts = 0
    with pytest.raises(queue.Full):
        for _ in range(1024):
            q.put(Received("worker:0", chunk, b"", False), block=False)
            puts += 1
    assert puts == QUEUE_BYTES >> 20 and q.bytes == QUEUE_BYTES
    q.get()
    q.put(Received("worker:0", chunk, b"", False), block=False)  # room again once the loop took one
    big = InputQueue(max_bytes=10)
    big.put(Received("worker:0", chunk, b"", False), block=False)  # one read larger than the bound goes in alone


def test_a_record_is_written_from_the_reserve_when_the_disk_is_full(tmp_path, monkeypatch):
    import errno as _errno

    from orchestrator.runs import RunDir, write_json_atomic
    from orchestrator.runs import rundir as rd
    from orchestrator.runs.reserve import RESERVE_BYTES

    run = RunDir.create(tmp_path / "run")
    assert run.reserve.stat().st_size == RESERVE_BYTES
    real = rd._write_atomic
    calls = []

    def full_once(path, data, durable):  # the first try finds the disk full, as on a flooded tmpfs
        calls.append(path)
        if len(calls) == 1:
            raise OSError(_errno.ENOSPC, "No space left on device")
        real(path, data, durable)

    monkeypatch.setattr(rd, "_write_atomic", full_once)
    write_json_atomic(run.result_json, {"state": "succeeded"})
    assert json.loads(run.result_json.read_text()) == {"state": "succeeded"} and len(calls) == 2
    assert run.reserve.stat().st_size == RESERVE_BYTES  # taken back once the write was done
