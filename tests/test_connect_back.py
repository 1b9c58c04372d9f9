"""Connect-back channels: real worker_entry processes dial a real supervisor over TCP (no scheduler).

The same supervisor runs tasks over these sockets as over SSH channels; only nodes holding the run's
secret for an expected rank get in, and a node refuses a supervisor that does not hold it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fakenode import make_plan
from supervising import Recorder
from waiting import wait_for

from orchestrator.backends.tcp import ConnectBackBackend, ConnectBackServer
from orchestrator.core.states import JobState, TaskState
from orchestrator.events import EventBus
from orchestrator.supervise import Interrupt, Supervisor
from worker_entry import protocol as p
from worker_entry.agent.modes.connect import HandshakeError, Refused, connect_back, mac
from worker_entry.protocol import handshake as hs

REPO = Path(__file__).resolve().parent.parent


class LocalNodes(ConnectBackBackend):
    """A stand-in scheduler: starts every task as a local `python -m worker_entry connect` process."""

    name = "local-connect-back"

    def __init__(self) -> None:
        super().__init__(bind=("127.0.0.1", 0))
        self.procs: list[subprocess.Popen] = []
        self.channels: list = []

    def start_all(self, starts, deliver):
        def keep(task, chan):  # the channels, to close them at the end (see ``close``)
            if not isinstance(chan, Exception):
                self.channels.append(chan)
            deliver(task, chan)

        return super().start_all(starts, keep)

    def launch(self, starts) -> None:
        for rank, _ in enumerate(starts):
            env = {**os.environ, **self.connect_env(), p.Env.RANK: str(rank), "PYTHONPATH": str(REPO)}
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker_entry", "connect"],
                env=env,
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            proc.stdin.write(self.secret_input())
            proc.stdin.close()
            self.procs.append(proc)

    def close(self) -> None:
        super().close()
        for chan in self.channels:  # EOF: a node serving its hand-over ends now, not after its launcher timeout
            chan.close()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


#: Heartbeats for real `worker_entry` processes on a loaded machine: make_plan's 0.1 s (meant for fake
#: nodes) blames a peer silent for 0.3 s as the root cause of any failure (``suspect_after_s``), and on
#: 2 busy cores a real process's beat is that late now and then: the wrong task was named.
REAL_HEARTBEAT = {"interval_s": 1.0, "timeout_s": 10.0, "progress_timeout_s": None}


def real_plan(n: int, **job):
    """make_plan for real node processes: a startup deadline and heartbeats a loaded machine keeps."""
    return make_plan(n, job={"startup_timeout_s": 60, **job}, heartbeat=REAL_HEARTBEAT)


def run_over_sockets(command, n=2):
    loaded, plan = real_plan(n, command=command)
    backend = LocalNodes()
    rec = Recorder()
    sup = Supervisor(
        loaded.spec, plan, backend, attempt=0, bus=EventBus([rec]), logs=rec, heartbeats=rec, interrupt=Interrupt()
    )
    try:
        res = sup.run()
    finally:
        backend.close()
    return res, rec, backend


def test_tasks_run_over_connect_back_channels_and_never_see_the_secret():
    code = (
        "import os, json; print(json.dumps({'task': os.environ['TFCLUSTER_TASK_INDEX'], "
        "'secret': os.environ.get('TFCLUSTER_SECRET'), 'tf': 'TF_CONFIG' in os.environ}))"
    )
    res, rec, backend = run_over_sockets([sys.executable, "-c", code])
    assert res.state == JobState.SUCCEEDED, res.root_cause
    for i in range(2):
        line = json.loads(rec.lines[f"worker:{i}"].decode().strip().splitlines()[-1])
        assert line == {"task": str(i), "secret": None, "tf": True}
    assert [e.event for e in rec.events].count("task_ready") == 2
    assert backend.rejected() == []
    assert all(proc.returncode == 0 for proc in backend.procs)


def test_a_failing_task_over_a_socket_tears_the_other_down():
    code = "import os, sys, time; i = int(os.environ['TFCLUSTER_TASK_INDEX']); time.sleep(0.5); sys.exit(3 if i == 1 else 0) if i == 1 else time.sleep(60)"
    res, _, backend = run_over_sockets([sys.executable, "-c", code])
    assert res.root_cause.task == "worker:1" and res.root_cause.exit_code == 3
    assert res.tasks["worker:0"].state == TaskState.STOPPED
    assert all(proc.returncode is not None for proc in backend.procs)


@pytest.fixture
def server():
    srv = ConnectBackServer(b"s" * 32, bind=("127.0.0.1", 0))
    got: list = []
    config = p.NodeConfig(argv=["true"], remote_dir="/tmp/x")
    srv.expect({0: ("worker:0", config), 1: ("worker:1", config)}, lambda task, chan: got.append((task, chan)))
    srv.got = got
    yield srv
    srv.close()
    for _, chan in got:
        chan.close()


def _wait_rejected(srv, n):
    wait_for(lambda: len(srv.rejected) >= n, 10, f"{n} refusal(s) recorded", interval=0.01)


def test_the_right_secret_and_rank_get_their_config(server):
    link = connect_back(("127.0.0.1", server.port), b"s" * 32, 1)
    link.sock.close()
    assert p.NodeConfig.parse_line(link.config_line).argv == ["true"]
    wait_for(lambda: server.got, 10, "the channel delivered", interval=0.01)  # right after the config is sent
    assert [t for t, _ in server.got] == ["worker:1"]


@pytest.mark.parametrize(
    ("secret", "rank", "why", "final"),
    [(b"x" * 32, 0, "wrong secret", False), (b"s" * 32, 7, "rank 7 is not a task of this run", True)],
)
def test_a_wrong_secret_or_an_unknown_rank_is_refused(server, secret, rank, why, final):
    """A signed refusal (the node proved the secret, its rank is wrong) ends the node's dialing at once;
    an unsigned one is only worth another try, until the node's deadline."""
    with pytest.raises(Refused if final else HandshakeError) as err:
        connect_back(("127.0.0.1", server.port), secret, rank, deadline_s=0.5)
    assert why in str(err.value) and (final or "gave up after" in str(err.value))
    _wait_rejected(server, 1)
    assert why in server.rejected[0][1] and server.got == []


def test_a_rank_connects_once(server):
    link = connect_back(("127.0.0.1", server.port), b"s" * 32, 0)
    wait_for(lambda: server.got, 10, "the channel delivered", interval=0.01)
    with pytest.raises(Refused, match="already connected"):
        connect_back(("127.0.0.1", server.port), b"s" * 32, 0)
    link.sock.close()
    _wait_rejected(server, 1)
    assert "already connected" in server.rejected[0][1] and len(server.got) == 1


def test_a_restarted_rank_connects_once_more_to_its_own_deliver_and_a_given_up_restart_never(server):
    """expect_again: the restarted task's rank dials again, gets the restart's config, and its channel
    goes to the restart's deliver; a restart given up on (forget_again) may not connect at all; a new
    attempt (expect) drops a restart of the previous one that never connected."""
    first = connect_back(("127.0.0.1", server.port), b"s" * 32, 1)
    wait_for(lambda: server.got, 10, "the channel delivered", interval=0.01)
    first.sock.close()
    again: list = []
    restart = p.NodeConfig(argv=["true"], remote_dir="/tmp/x-restart-1")
    server.expect_again(1, "worker:1", restart, lambda task, chan: again.append((task, chan)))
    link = connect_back(("127.0.0.1", server.port), b"s" * 32, 1)
    assert p.NodeConfig.parse_line(link.config_line).remote_dir == "/tmp/x-restart-1"
    wait_for(lambda: again, 10, "the restart's channel delivered", interval=0.01)
    assert [t for t, _ in again] == ["worker:1"] and len(server.got) == 1
    link.sock.close()
    # given up on: the rank stays closed, nothing reaches the forgotten deliver
    lost: list = []
    deliver = lambda task, chan: lost.append(chan)  # noqa: E731
    server.expect_again(1, "worker:1", restart, deliver)
    server.forget_again(1, "worker:1", deliver)
    with pytest.raises(Refused, match="already connected"):
        connect_back(("127.0.0.1", server.port), b"s" * 32, 1, deadline_s=2)
    # a new attempt: a restart of the last one that never connected is not this attempt's
    server.expect_again(0, "worker:0", restart, deliver)
    fresh: list = []
    server.expect(
        {0: ("worker:0", p.NodeConfig(argv=["true"], remote_dir="/tmp/y", attempt=1))},
        lambda task, chan: fresh.append((task, chan)),
    )
    link = connect_back(("127.0.0.1", server.port), b"s" * 32, 0, attempt=1)  # a node of attempt 1 (its proof says so)
    assert p.NodeConfig.parse_line(link.config_line).attempt == 1
    wait_for(lambda: fresh, 10, "the new attempt's channel delivered", interval=0.01)
    assert [t for t, _ in fresh] == ["worker:0"] and not lost
    link.sock.close()
    for _, chan in again + fresh:
        chan.close()


def test_garbage_and_silence_are_refused_without_harm(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.recv(4096)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\xff" * 10000)
        try:
            assert s.recv(4096) == b""  # closed on us
        except ConnectionResetError:
            pass  # closed with unread data: a reset, also closed on us
    _wait_rejected(server, 1)
    assert server.rejected[0][1] in (
        "not a tfcluster handshake line",
        "handshake line too long",
        "not a tfcluster node (data after its answer)",
    )
    assert server.got == []


def test_the_node_refuses_a_supervisor_without_the_secret():
    """Mutual: a node only runs what a supervisor holding the run's secret tells it."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def impostor() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.sendall(json.dumps({"tfcluster": "connect", "v": hs.VERSION, "nonce": "a" * 64}).encode() + b"\n")
            answer = json.loads(conn.makefile().readline())
            forged = mac(b"not-the-secret-at-all", b"supervisor", answer["nonce"], "a" * 64, answer["rank"])
            conn.sendall(json.dumps({"ok": True, "mac": forged}).encode() + b"\n")
            conn.sendall(b'{"argv":["rm","-rf","/"],"remote_dir":"/"}\n')

    t = threading.Thread(target=impostor)
    t.start()
    try:
        with pytest.raises(HandshakeError, match="does not hold this run's secret"):
            connect_back(("127.0.0.1", port), b"s" * 32, 0, deadline_s=0.5)
    finally:
        t.join(5)
        lsock.close()


def _backlog(port: int) -> int:
    """The listening socket's accept queue length as the kernel has it (``ss``: Send-Q of a LISTEN socket)."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])


@pytest.mark.skipif(not Path("/proc/sys/net/core/somaxconn").exists(), reason="Linux's accept queue")
def test_the_accept_queue_holds_every_task_of_the_round_dialing_at_once():
    """4,096 nodes dialing at once into a queue of 1,024: the SYNs past it are dropped and wait out TCP's
    1 s, 3 s retransmits. The queue is sized to the round's tasks, up to the kernel's cap (somaxconn)."""
    import shutil

    if shutil.which("ss") is None:
        pytest.skip("no ss to read the queue's length")
    cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    srv = ConnectBackServer(b"s" * 32, bind=("127.0.0.1", 0))
    try:
        assert _backlog(srv.port) == min(1024, cap)
        config = p.NodeConfig(argv=["true"], remote_dir="/tmp/x")
        srv.expect({r: (f"worker:{r}", config) for r in range(3000)}, lambda task, chan: chan.close())
        assert _backlog(srv.port) == min(3000, cap)
        srv.expect({0: ("worker:0", config)}, lambda task, chan: chan.close())
        assert _backlog(srv.port) == min(1024, cap)  # never below the default
    finally:
        srv.close()
