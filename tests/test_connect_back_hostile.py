"""The connect-back port on a hostile network, with real sockets and real worker_entry processes.

Slow or silent unauthenticated connections cost the supervisor neither a slot nor a thread and never
keep a node out; the handshake has one deadline; descriptors above 1024 work; running out of
descriptors neither spins nor locks nodes out; nodes retry until their own deadline; refusals are
reported, bounded; one read takes a bounded amount off the socket. The relayed (man-in-the-middle)
cases are in test_connect_back_relay.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from netattack import Slowloris
from test_connect_back import REPO, LocalNodes, real_plan
from waiting import wait_for

from orchestrator.backends import handshakes, wait_readable
from orchestrator.backends.refusals import Refusals
from orchestrator.backends.tcp import ConnectBackServer
from orchestrator.core.states import JobState
from orchestrator.job import Job, LaunchOptions
from orchestrator.runs import RunDir
from orchestrator.views.control import job_status, status_text
from worker_entry import protocol as p
from worker_entry.agent.modes.connect import connect_back

SECRET = b"s" * 32
CONFIG = p.NodeConfig(argv=["true"], remote_dir="/tmp/x", env={"API_TOKEN": "tok-do-not-leak"})


@pytest.fixture
def server():
    srv = ConnectBackServer(SECRET, bind=("127.0.0.1", 0))
    got: list = []
    srv.expect({r: (f"worker:{r}", CONFIG) for r in range(3)}, lambda task, chan: got.append((task, chan)))
    srv.got = got
    yield srv
    srv.close()
    for _, chan in got:
        chan.close()


def test_hundreds_of_slow_connections_take_no_slot_and_no_thread(server):
    threads = threading.active_count()
    with Slowloris(server.port, 300) as attack:
        attack.wait_greeted()
        assert server.server.pending() >= 300
        assert threading.active_count() <= threads + 1  # the attacker's own thread: none per connection here
        link = connect_back(("127.0.0.1", server.port), SECRET, 1, deadline_s=60)
        link.sock.close()
    assert p.NodeConfig.parse_line(link.config_line).env == {"API_TOKEN": "tok-do-not-leak"}
    wait_for(lambda: server.got, 10, "the channel delivered", interval=0.01)
    assert [t for t, _ in server.got] == ["worker:1"]


def test_a_handshake_has_one_deadline_however_its_bytes_trickle(server, monkeypatch):
    monkeypatch.setattr(handshakes, "HANDSHAKE_TIMEOUT_S", 1.0)
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.recv(4096)
        try:
            while sent < 400:  # 20 s at this pace: the old per-recv timeout (10 s) never fired
                s.send(b"{")
                sent += 1
                time.sleep(0.05)
        except OSError:
            pass  # closed on us (a reset: unread bytes)
    assert sent < 400
    wait_for(lambda: server.rejected, 10, "a refusal recorded", interval=0.01)
    assert server.rejected[-1][1] == "handshake not completed in time"


def test_a_non_ascii_mac_is_refused_without_a_traceback(server, capfd):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.recv(4096)
        s.sendall(json.dumps({"rank": 0, "attempt": 0, "nonce": "a" * 64, "mac": "é" * 64}).encode() + b"\n")
        with contextlib.suppress(ConnectionResetError):
            s.recv(4096)
    wait_for(lambda: server.rejected, 10, "a refusal recorded", interval=0.01)
    assert "malformed nonce or MAC" in server.rejected[-1][1]
    assert "Traceback" not in capfd.readouterr().err


def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def test_descriptors_above_1024_work_for_the_server_and_its_channels():
    _raise_nofile(4096)
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        srv = ConnectBackServer(SECRET, bind=("127.0.0.1", 0))
        got: list = []
        srv.expect({0: ("worker:0", CONFIG)}, lambda task, chan: got.append(chan))
        try:
            link = connect_back(("127.0.0.1", srv.port), SECRET, 0, deadline_s=30)
            wait_for(lambda: got, 10, "the channel delivered", interval=0.01)
            chan = got[0]
            assert srv.server.listener.fileno() > 1024 and chan.sock.fileno() > 1024
            received = bytearray()
            big = b"x" * (16 << 20)  # more than the socket buffers: send() must wait for writability

            def node_reads() -> None:
                while len(received) < len(big) + 1:
                    data = link.sock.recv(1 << 20)
                    if not data:
                        return
                    received.extend(link.opener.feed(data))

            reader = threading.Thread(target=node_reads)
            reader.start()
            chan.send(big + b"\n")
            reader.join(60)
            assert bytes(received) == big + b"\n"
            link.sock.sendall(link.sealer.seal(p.MARKER + p.msg_frame(p.Spawned(pid=7))))
            decoder, frames = p.FrameDecoder(), []
            for _ in range(100):  # what the transfers do on a task's channel: any descriptor number
                wait_readable(chan.filenos(), 1.0)
                if frames := decoder.feed(chan.read()[0]):
                    break
            assert p.parse_message(frames[0].payload) == p.Spawned(pid=7)
            chan.close()
            link.sock.close()
        finally:
            srv.close()
    finally:
        for fd in fillers:
            os.close(fd)


SERVER_SCRIPT = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
from orchestrator.backends import handshakes, wait_readable
from orchestrator.backends.tcp import ConnectBackServer
from worker_entry import protocol as p
handshakes.HANDSHAKE_TIMEOUT_S = 3600.0  # only making room frees a descriptor here, never a deadline
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
srv = ConnectBackServer(b"s" * 32, bind=("127.0.0.1", 0))
got = []
srv.expect({0: ("worker:0", p.NodeConfig(argv=["true"], remote_dir="/tmp/x"))}, lambda t, c: got.append(t))
fillers = []
print(json.dumps({"port": srv.port}), flush=True)
for line in sys.stdin:
    if line.strip() == "fill":
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
    elif line.strip() == "free":
        while fillers:
            os.close(fillers.pop())
    pauses = srv.server.accept_pauses  # read first: a failure may be under way, its pause not yet
    print(json.dumps({"accept_pauses": pauses, "accept_errors": srv.server.accept_errors, "got": got,
                      "pending": srv.server.pending()}), flush=True)
srv.close()
"""


class FdLimitedServer:
    """A ConnectBackServer in its own process with a small descriptor limit, driven over stdin."""

    def __init__(self, nofile: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_SCRIPT, str(REPO), str(nofile)],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def ask(self, command: str = "stats") -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def wait_for(self, pred, what: str, timeout: float = 60.0) -> dict:
        """The agent's stats once ``pred`` holds for them."""
        return wait_for(lambda: (lambda st: pred(st) and st)(self.ask()), timeout, what, interval=0.05)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_out_of_descriptors_the_accept_loop_backs_off_instead_of_spinning():
    srv = FdLimitedServer(64)
    try:
        srv.ask("fill")
        with socket.create_connection(("127.0.0.1", srv.port)):  # waits in the backlog: accept() fails
            stats = srv.wait_for(lambda s: s["accept_pauses"] >= 3, "3 accept pauses")
            # Every failed accept() was followed by a pause (a spinning loop retries at once: ~10^5 a second).
            assert stats["accept_pauses"] <= stats["accept_errors"] <= stats["accept_pauses"] + 1
        srv.ask("free")
        link = connect_back(("127.0.0.1", srv.port), SECRET, 0, deadline_s=60)
        link.sock.close()
        srv.wait_for(lambda s: s["got"] == ["worker:0"], "worker:0 delivered")
    finally:
        srv.close()


def test_silent_connections_holding_every_descriptor_cannot_lock_a_node_out():
    """Unproven connections never expire here (deadline: an hour): only dropping the oldest for the newest
    lets the node in."""
    srv = FdLimitedServer(64)
    attackers = []
    try:
        for _ in range(100):
            attackers.append(socket.create_connection(("127.0.0.1", srv.port)))
        srv.wait_for(lambda s: s["accept_errors"] >= 1, "an accept error")
        link = connect_back(("127.0.0.1", srv.port), SECRET, 0, deadline_s=60)
        link.sock.close()
        srv.wait_for(lambda s: s["got"] == ["worker:0"], "worker:0 delivered")
    finally:
        for s in attackers:
            s.close()
        srv.close()


def test_a_node_keeps_dialing_until_the_supervisor_takes_it():
    """The first connection is dropped (a supervisor not ready, a flood): the node dials again."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    env = {**os.environ, p.Env.CONNECT: f"127.0.0.1:{port}", p.Env.RANK: "0", "PYTHONPATH": str(REPO)}
    node = subprocess.Popen(
        [sys.executable, "-m", "worker_entry", "connect"], env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    node.stdin.write(SECRET.hex().encode() + b"\n")
    node.stdin.close()
    got: list = []
    srv = None
    try:
        first, _ = probe.accept()  # the node dialed: drop it, stop listening, then the real server comes up
        first.close()
        probe.close()
        srv = ConnectBackServer(SECRET, bind=("127.0.0.1", port))
        srv.expect({0: ("worker:0", p.NodeConfig(argv=["true"], remote_dir="/tmp/x"))}, lambda t, c: got.append(c))
        wait_for(lambda: got, 10, "the channel delivered", interval=0.01)
        assert got, node.stderr.read1().decode()
        got[0].send(p.command_line(p.Stop(grace_s=0, reason="test over")))
        got[0].close()  # after the stop: the node ends without waiting for a hand-over
        assert node.wait(30) == 0
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        node.stderr.close()
        if srv is not None:
            srv.close()
        for c in got:
            c.close()


def test_refusals_are_reported_at_once_then_at_most_once_per_interval():
    r = Refusals(interval_s=10.0)
    assert r.report(0.0) is None
    r.add("1.2.3.4:5", "rank 0: wrong secret")
    first = r.report(0.0)
    assert (first.count, first.peer, first.reason, first.total) == (1, "1.2.3.4:5", "rank 0: wrong secret", 1)
    for i in range(500):
        r.add(f"6.6.6.6:{i}", "handshake not completed in time")
    assert r.report(5.0) is None  # within the interval: summed up later
    later = r.report(10.0)
    assert (later.count, later.peer, later.total) == (500, "6.6.6.6:0", 501)
    assert r.report(30.0) is None
    r.add("6.6.6.6:500", "handshake not completed in time")
    assert r.report(12.0) is None  # within the interval of the last report (at 10)
    last = r.report(12.0, final=True)  # the attempt ends: told at once, not lost
    assert (last.count, last.total) == (1, 502) and r.report(12.5, final=True) is None
    summary = r.summary()
    assert summary["count"] == 502 and len(summary["recent"]) == 10 and summary["recent"][-1]["peer"] == "6.6.6.6:500"


def test_refused_connections_reach_events_status_and_the_status_command(tmp_path):
    """Through the real job: the launcher says what it refused (events.jsonl, status.json, `status`)."""
    flag = tmp_path / "go-on"
    code = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.05)"
    loaded, plan = real_plan(2, command=[sys.executable, "-c", code])
    backend = LocalNodes()
    run = tmp_path / "run"
    job = Job(loaded, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), backend)

    def attack() -> None:
        with contextlib.suppress(OSError):
            connect_back(("127.0.0.1", backend.server.port), b"w" * 32, 0, deadline_s=0.3)
        with socket.create_connection(("127.0.0.1", backend.server.port)) as s:
            s.recv(4096)
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            with contextlib.suppress(OSError):
                s.recv(4096)

        def refused() -> dict:
            with contextlib.suppress(OSError, ValueError):
                return json.loads((run / "status.json").read_text()).get("refused_connections") or {}
            return {}

        try:
            wait_for(
                lambda: refused().get("count", 0) >= 2 and "connection_refused" in _events(run),
                60,
                "both refusals in status.json and a connection_refused event",
                interval=0.05,
            )
        finally:
            flag.touch()  # the job ends either way (the assertions below say what was missing)

    t = threading.Thread(target=attack)
    t.start()
    result = job.run()
    t.join(60)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    lines = (run / "events.jsonl").read_text().splitlines()
    refused = [json.loads(line) for line in lines if '"connection_refused"' in line]
    assert refused[0]["reason"] == "rank 0: wrong secret" and refused[0]["peer"].startswith("127.0.0.1:")
    st = job_status(RunDir(run))
    # every refusal is told by an event by the end (the last ones at the attempt's end, whatever the rate)
    assert sum(e["count"] for e in refused) == refused[-1]["total"] == st["refused_connections"]["count"]
    assert st["refused_connections"]["count"] >= 2
    assert {r["reason"] for r in st["refused_connections"]["recent"]} >= {"rank 0: wrong secret"}
    assert "connect-back port: " in status_text(st) and "connection(s) refused" in status_text(st)


def _events(run: Path) -> dict[str, dict]:
    path = run / "events.jsonl"
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                out.setdefault(ev["event"], ev)
    return out


def test_one_read_takes_at_most_a_bounded_amount_off_the_socket(server):
    """A node that streams as fast as the link allows never makes one read() return more than READ_MAX."""
    from orchestrator.backends.tcp import READ_MAX

    link = connect_back(("127.0.0.1", server.port), SECRET, 0, deadline_s=30)
    wait_for(lambda: server.got, 10, "the channel delivered", interval=0.01)
    chan = server.got[0][1]
    total = 64 << 20
    plain = b"y" * (1 << 20)

    def flood() -> None:
        with contextlib.suppress(OSError):
            for _ in range(total >> 20):
                link.sock.sendall(link.sealer.seal(plain))
            link.sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=flood)
    sender.start()
    sizes, eof = [], False
    with selectors.DefaultSelector() as sel:
        sel.register(chan.sock, selectors.EVENT_READ)
        while not eof and sel.select(30):
            out, _, eof = chan.read()
            sizes.append(len(out))
    sender.join(30)
    link.sock.close()
    assert READ_MAX == 1 << 20 and sum(sizes) == total and max(sizes) <= 1 << 20
