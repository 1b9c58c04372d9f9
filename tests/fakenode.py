"""An in-process fake node and backend: drive the real supervisor and job without sshd or TensorFlow.

A ``FakeNode`` speaks the real wire protocol (``worker_entry.protocol`` frames and messages) on a
``FakeChannel`` whose launcher side is a real pipe, so the real pump, decoder and session read it.
A node runs a *script* (a function of the node) in a thread: the default one behaves like a healthy
worker_entry; tests pass their own to inject faults. This is a unit-test tool: the e2e tiers use
real sshd, processes and TensorFlow.

Time: the supervisor under test is given a ``FakeClock`` (the backend's ``clock``). Where a test needs
the supervisor's time to pass — a silence past a timeout, a start past its deadline — a script moves
that clock on (``advance``, or ``let_pass`` while the other nodes keep beating) instead of sleeping:
what the supervisor judges does not depend on how fast this machine runs the threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fakechannel import FakeChannel

from orchestrator.backends import Channel, PerTaskBackend
from orchestrator.core.diagnostics import Diagnostic
from orchestrator.plan import NodePlan
from orchestrator.schedulers.ssh import ssh_plan
from orchestrator.spec import load_spec_text
from tfcluster_testbed.waiting import wait_for
from worker_entry import protocol as p
from worker_entry.protocol.cluster import cluster_endpoint


class FakeClock:
    """The supervisor's clock in the unit tier: the real monotonic clock plus the seconds a test moved
    it on by (``advance``). The supervisor's ticks still come (it keeps running), and a timeout is
    reached when the test says so, not after that much wall time."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.frozen_at: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return (self.frozen_at if self.frozen_at is not None else time.monotonic()) + self.offset

    def freeze(self) -> None:
        """From now on only ``advance`` moves it (the supervisor's periodic scans stop: for tests of
        what inputs alone decide, and of a deadline the test alone reaches)."""
        self.frozen_at = time.monotonic()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.offset += seconds


class FakeNode:
    """One node's worker_entry, scripted. Helpers send real frames; ``commands`` are parsed for real."""

    def __init__(
        self,
        node: NodePlan,
        config: p.NodeConfig,
        chan: FakeChannel,
        script: Script,
        backend: FakeBackend | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.node = node
        self.claimed_endpoint = endpoint
        self.config = config
        self.chan = chan
        self.script = script
        self.backend = backend
        self.beating = False  # in a heartbeat loop (``let_pass`` waits for its next beat)
        self.seq = 0
        self.received: list[p.Message] = []
        self.eof = False
        self._buf = b""
        self.thread = threading.Thread(target=self._run, name=f"fake-{node.task}", daemon=True)

    @property
    def task(self) -> str:
        return str(self.node.task)

    @property
    def clock(self) -> FakeClock:
        """The supervisor's clock (its backend's)."""
        assert self.backend is not None, "a node without a backend has no supervisor clock"
        return self.backend.clock

    def let_pass(self, seconds: float, step: float = 0.25) -> None:
        """``seconds`` of the supervisor's time pass while this node says nothing: the clock moves on in
        ``step``s, and after each one every other node in a heartbeat loop beats again before the next,
        so only this node looks silent (``step`` well below heartbeat.timeout_s)."""
        assert self.backend is not None
        others = [n for n in self.backend.nodes.values() if n is not self]
        wait_for(  # a peer not yet in its heartbeat loop (its go still on its way) would look silent too
            lambda: all(n.beating or not n.thread.is_alive() for n in others),
            10,
            "every other running node to be in its heartbeat loop (a script that idles: use clock.advance)",
            interval=0.005,
        )
        left = seconds
        while left > 0:
            peers = {n: n.seq for n in self.backend.history if n is not self and n.beating}
            self.clock.advance(min(step, left))
            left -= step
            wait_for(
                lambda peers=peers: all(not n.beating or n.seq > seq for n, seq in peers.items()),
                10,
                "the other nodes to beat after the supervisor's clock moved on",
                interval=0.005,
            )

    @property
    def endpoint(self) -> str | None:
        """Where its TF server listens, as a real node reports it (its entry of the plan's cluster), or what
        its backend was told it claims instead."""
        return self.claimed_endpoint or cluster_endpoint(self.node.common.cluster, self.node.task)

    def _run(self) -> None:
        try:
            self.script(self)
        finally:
            self.chan.hang_up(self.chan.status if self.chan.status is not None else 0)

    # --- sending ---------------------------------------------------------------------------------
    def raw(self, data: bytes) -> None:
        self.chan.write(data)

    def send(self, msg: p.Message | dict[str, Any]) -> None:
        self.raw(p.msg_frame(msg))

    def log(self, text: str, stream: int = p.STDOUT) -> None:
        self.raw(p.log_frame(stream, text.encode() if text.endswith("\n") else (text + "\n").encode()))

    def hello(self, **facts: Any) -> None:
        self.raw(p.MARKER)
        facts.setdefault("hostname", f"host-{self.task}")
        facts.setdefault("time", time.time())
        self.send(
            p.Hello(
                pid=1000 + self.node.task.index,
                remote_dir="/tmp/x",
                facts=p.NodeFacts(**facts),
                tf_endpoint=self.endpoint,
                node_name=f"node-{self.task.replace(':', '')}",
            )
        )

    def heartbeat(self, **fields: Any) -> None:
        self.seq += 1
        self.send(p.Heartbeat(seq=self.seq, ts=time.time(), **fields))

    def exited(self, code: int | None = 0, **fields: Any) -> None:
        self.send(p.Exited(code=code, ended=time.time(), **fields))

    # --- receiving -------------------------------------------------------------------------------
    def next_command(self, timeout: float) -> p.Message | None:
        """The next command from the launcher (None on timeout or EOF)."""
        deadline = time.monotonic() + timeout
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if not line.strip():
                    continue
                cmd = p.parse_command(line)
                self.received.append(cmd)
                return cmd
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                return None
            try:
                data = self.chan.inbox.get(timeout=left)
            except queue.Empty:
                return None
            if data is None:
                self.eof = True
                return None
            self._buf += data

    def wait_for(self, kind: type[p.Message], timeout: float = 10.0) -> p.Message | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            cmd = self.next_command(left)
            if cmd is None and self.eof:
                return None
            if isinstance(cmd, (kind, p.Stop)):
                return cmd
        return None

    def idle(self, timeout: float = 30.0) -> p.Message | None:
        """Say nothing (a hung process, a cut link) until a stop, EOF or ``timeout``; pings are ignored."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            cmd = self.next_command(left)
            if isinstance(cmd, p.Stop) or self.eof:
                return cmd
        return None

    def run_until_stopped(self, beats: float = 0.05, steps: int = 0, **hb: Any) -> p.Stop | None:
        """Heartbeat (with progress when ``steps``) until a stop or EOF; returns the stop."""
        n = 0
        self.beating = True
        try:
            while True:
                n += steps
                progress = p.Progress(steps=n, examples=n * 32, ts=time.time()) if steps else None
                self.heartbeat(progress=progress, **{"state": "running", **hb})
                cmd = self.next_command(beats)
                if isinstance(cmd, p.Stop):
                    return cmd
                if self.eof:
                    return None
        finally:
            self.beating = False


Script = Callable[[FakeNode], None]


def lost_for_good(host: str, *more: tuple[str, int]) -> Script:
    """A node that trains, except on ``host`` in attempt 0 (and each (host, attempt) of ``more``):
    there its output ends without an exit status after the go (the link or the host went away)."""

    def script(n: FakeNode) -> None:
        if (n.node.host, n.config.attempt) not in {(host, 0), *more}:
            return healthy(0.6)(n)
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=7))
        n.chan.end_output()
        n.idle(30)

    return script


def healthy(run_s: float = 0.3, code: int = 0) -> Script:
    """A worker that starts, runs ``run_s`` seconds heartbeating, prints a line and exits ``code``."""

    def script(n: FakeNode) -> None:
        n.hello()
        cmd = n.wait_for(p.Go)
        if isinstance(cmd, p.Stop) or cmd is None:
            n.exited(None, not_started=True, reason="stopped before the go")
            return
        n.send(p.Spawned(pid=2000 + n.node.task.index))
        n.send(p.Started(how="strategy"))
        n.log(f"{n.task}: training")
        end = time.monotonic() + run_s
        n.beating = True
        while time.monotonic() < end:
            n.heartbeat(state="running", progress=p.Progress(steps=1, ts=time.time()))
            cmd = n.next_command(0.05)
            if isinstance(cmd, p.Stop) or n.eof:
                n.beating = False
                stopped(n, cmd)
                return
        n.beating = False
        if code:
            n.log(f"{n.task}: failing with {code}", p.STDERR)
        n.exited(code)

    return script


def stopped(n: FakeNode, cmd: p.Message | None) -> None:
    """What worker_entry does on a stop (or EOF): the process dies of the signal, reported."""
    sig = cmd.signal if isinstance(cmd, p.Stop) else 15
    n.send(p.Stopping(reason=cmd.reason if isinstance(cmd, p.Stop) else "launcher closed the connection"))
    n.exited(None, signal=sig, signal_name="SIGTERM" if sig == 15 else "SIGINT", stopped=True)


def obedient(n: FakeNode) -> None:
    """Starts, then runs until told to stop (the peers of a failing task)."""
    n.hello()
    cmd = n.wait_for(p.Go)
    if not isinstance(cmd, p.Go):
        n.exited(None, not_started=True, reason="stopped before the go")
        return
    n.send(p.Spawned(pid=2000 + n.node.task.index))
    n.send(p.Started(how="strategy"))
    stopped(n, n.run_until_stopped())


class FakeBackend(PerTaskBackend):
    name = "fake"

    def __init__(
        self,
        scripts: dict[str, Script],
        unreachable: Sequence[str] = (),
        clock: FakeClock | None = None,
        endpoints: dict[str, str] | None = None,
    ) -> None:
        self.scripts = scripts
        self.unreachable = set(unreachable)
        self.clock = clock if clock is not None else FakeClock()  # the supervisor's, when the test gives it one
        self.endpoints = dict(endpoints or {})  # task -> the endpoint its node claims in its hello
        self.nodes: dict[str, FakeNode] = {}
        self.history: list[FakeNode] = []
        self.closed = False
        self._lock = threading.Lock()  # start_all's threads and close() race: a node is started whole or not at all

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        return [
            Diagnostic(f"connection refused on {n.host}", "start sshd", task=str(n.task), host=n.host, code="refused")
            for n in nodes
            if str(n.task) in self.unreachable
        ]

    def start(self, node: NodePlan, config: p.NodeConfig) -> Channel:
        with self._lock:
            if self.closed:
                raise OSError("the backend is closed")
            chan = FakeChannel()
            script = self.scripts.get(str(node.task), obedient)
            fake = FakeNode(node, config, chan, script, self, self.endpoints.get(str(node.task)))
            self.nodes[str(node.task)] = fake
            self.history.append(fake)
            fake.thread.start()
        return chan

    def close(self) -> None:
        with self._lock:
            self.closed = True
            started = list(self.history)
        for n in started:
            n.chan.close()
        for n in started:
            n.thread.join(5)


def make_plan(n_hosts: int = 3, **sections: Any) -> tuple[Any, Any]:
    """A (LoadedSpec, Plan) for ``n_hosts`` made-up hosts with fast heartbeats."""
    import yaml

    doc: dict[str, Any] = {
        "version": 1,
        "name": "fake",
        "hosts": [{"address": f"10.0.0.{i + 1}"} for i in range(n_hosts)],
        "job": {"command": ["train"], "startup_timeout_s": 5, "failure_grace_s": 0.2, "stop_grace_s": 0.5},
        "heartbeat": {"interval_s": 0.1, "timeout_s": 1.0, "progress_timeout_s": None},
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    loaded = load_spec_text(yaml.safe_dump(doc), "fake.yaml")
    plan = ssh_plan(loaded.spec, run_id="fake-run", local_user="me", ssh_lookup=None)
    return loaded, plan
