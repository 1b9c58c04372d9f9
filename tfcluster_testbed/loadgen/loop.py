"""The load generator's process: dial N ranks back to a supervisor, then run them on a few selector loops.

    python -m tfcluster_testbed.loadgen --connect HOST:PORT --ranks 0-4095 [--threads 2] [--log-rate 0.2]

stdin: the run's secret (one line of hex), then cues, one a line: ``kill R``, ``exit R CODE``, ``hang R``,
``silent R``, ``drop R``, ``slow R FACTOR``, ``mark R`` (R: a rank, ``A-B`` or ``all``), ``quit``. stdout: one JSON
object a line: ``dialed`` (how many connected, how long it took), ``fault`` (rank, what, the wall-clock
moment it took effect: the start of a detection-latency measurement), ``done``.

Many nodes per thread: each loop owns a selector over its nodes' sockets and a heap of when each node
next has something to say, so 4,096 nodes cost a handful of threads and descriptors only for the
sockets. The handshake is ``dial`` alone (through ``worker_entry.agent.modes.connect``): a change of the
connect-back handshake is one edit here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import json
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from worker_entry import protocol as p
from worker_entry.agent.modes.connect import connect_back, parse_address

from .node import LoadNode

MAX_BUFFERED = 1 << 20  # bytes waiting for a slow supervisor before a node pauses (back-pressure)
_print_lock = threading.Lock()
_also: list[IO[str]] = []  # --events FILE


def say(**obj: object) -> None:
    line = json.dumps(obj) + "\n"
    with _print_lock:
        for stream in (sys.stdout, *_also):
            with contextlib.suppress(OSError, ValueError):
                stream.write(line)
                stream.flush()


@dataclass
class Dialed:
    """A proven connect-back connection: its socket, its ``NodeConfig`` line, and how bytes cross it
    (sealed records: ``wrap`` out, ``unwrap`` in)."""

    sock: socket.socket
    config_line: bytes
    wrap: Callable[[bytes], bytes] = lambda b: b
    unwrap: Callable[[bytes], bytes] = lambda b: b
    first: bytes = b""  # plaintext that came with the configuration line


def dial(address: tuple[str, int], secret: bytes, rank: int, timeout: float = 60.0, attempt: int = 0) -> Dialed:
    """The connect-back handshake, exactly a node's (``worker_entry.agent.modes.connect.connect_back``: both proofs,
    the channel's keys, the sealed configuration line), then the link's records sealed out and opened in.
    ``attempt``: the run's attempt the nodes play (a restart's nodes are refused with attempt 0's proof)."""
    link = connect_back(address, secret, rank, deadline_s=timeout, attempt=attempt)
    link.sock.setblocking(False)
    return Dialed(link.sock, link.config_line, wrap=link.sealer.seal, unwrap=link.opener.feed, first=link.rest)


class ConfigCache:
    """Each rank's ``NodeConfig`` parsed as a node parses it, the cluster only once per distinct cluster.

    Every config of a plan ends with the same cluster (``NodeConfig.to_line``: ``,"cluster":{...}}``, 70 KB
    at 4,096 tasks). A real node parses its own once; this one process playing every node parsed 4,096
    of them (~1 ms each under the GIL beside the dials and the heartbeats: ~4 s of the start). The part
    before the cluster is parsed and validated in full for each rank; a cluster whose bytes equal one
    already parsed (and validated) reuses that dict; a line of any other shape is parsed whole."""

    MARK = b',"cluster":'

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[bytes, dict[str, list[str]]] = {}

    def parse(self, line: bytes) -> p.NodeConfig:
        at = line.rfind(self.MARK)
        if at < 0:
            return p.NodeConfig.parse_line(line)
        tail = line[at + len(self.MARK) :].rstrip(b"\n")
        if not tail.endswith(b"}}"):
            return p.NodeConfig.parse_line(line)
        cluster_bytes = tail[:-1]
        with self._lock:
            cluster = self._clusters.get(cluster_bytes)
        if cluster is None:
            config = p.NodeConfig.parse_line(line)
            with self._lock:
                self._clusters[cluster_bytes] = config.cluster
            return config
        head = p.NodeConfig.parse_line(line[:at] + b"}\n")  # every other field, validated as the node does
        return dataclasses.replace(head, cluster=cluster)


@dataclass
class _Conn:
    node: LoadNode
    link: Dialed
    out: bytearray = field(default_factory=bytearray)
    closed: bool = False


class Loop(threading.Thread):
    """One selector over many nodes' sockets, and the heap of their next heartbeat/profile/log."""

    def __init__(self, index: int, log_rate: float) -> None:
        super().__init__(name=f"loadgen-{index}", daemon=True)
        self.log_rate = log_rate
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}
        self.heap: list[tuple[float, int]] = []
        self.scheduled: dict[int, float] = {}
        self.inbox: list[tuple[str, int, object]] = []
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.stopping = False

    # --- from other threads ----------------------------------------------------------------------

    def post(self, what: str, rank: int, arg: object = None) -> None:
        with self.lock:
            self.inbox.append((what, rank, arg))
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def live(self) -> int:
        with self.lock:
            return sum(1 for c in self.conns.values() if not c.closed) + sum(1 for w, _, _ in self.inbox if w == "add")

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stopping:
                now = time.monotonic()
                timeout = max(0.0, min(1.0, self.heap[0][0] - now)) if self.heap else 1.0
                for key, mask in self.sel.select(timeout):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            os.read(self.wake_r, 4096)
                        continue
                    conn = self.conns.get(key.data)
                    if conn is None or conn.closed:
                        continue
                    if mask & selectors.EVENT_READ:
                        self._readable(conn)
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        self._send(conn, b"")
                self._inbox()
                self._timers(time.monotonic())
        finally:
            for conn in self.conns.values():
                self._close(conn)
            self.sel.close()
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _inbox(self) -> None:
        with self.lock:
            items, self.inbox = self.inbox, []
        for what, rank, arg in items:
            if what == "add":
                link, config = arg  # type: ignore[misc]
                node = LoadNode(rank, config, log_rate=self.log_rate)
                conn = _Conn(node, link)
                self.conns[rank] = conn
                self.sel.register(link.sock, selectors.EVENT_READ, rank)
                self._send(conn, node.start())
                if link.first:
                    self._send(conn, node.feed(link.first, time.monotonic()))
                self._schedule(rank)
                continue
            conn = self.conns.get(rank)
            if conn is None or conn.closed:
                continue
            fault, value = arg  # type: ignore[misc]
            now = time.monotonic()
            data = conn.node.apply(fault, value, now)
            if data:
                self._send(conn, data)
            if fault == "drop":
                self._close(conn)
            say(event="fault", fault=fault, rank=rank, ts=time.time())
            self._schedule(rank)

    def _timers(self, now: float) -> None:
        while self.heap and self.heap[0][0] <= now:
            due, rank = heapq.heappop(self.heap)
            if self.scheduled.get(rank) != due:
                continue  # superseded
            del self.scheduled[rank]
            conn = self.conns.get(rank)
            if conn is None or conn.closed:
                continue
            if len(conn.out) < MAX_BUFFERED:  # else: paused until the supervisor reads again
                data = conn.node.due(now)
                if data:
                    self._send(conn, data)
            self._schedule(rank, retry=now + 0.05)

    def _schedule(self, rank: int, retry: float | None = None) -> None:
        conn = self.conns.get(rank)
        if conn is None or conn.closed:
            return
        due = conn.node.next_due()
        if retry is not None and due <= retry - 0.05:
            due = retry  # it could not say what was due (back-pressure): try again shortly
        if due == float("inf"):
            return
        old = self.scheduled.get(rank)
        if old is None or due < old:
            self.scheduled[rank] = due
            heapq.heappush(self.heap, (due, rank))

    # --- one socket --------------------------------------------------------------------------------

    def _readable(self, conn: _Conn) -> None:
        try:
            data = conn.link.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        reply = conn.node.feed(conn.link.unwrap(data), time.monotonic())
        if reply:
            self._send(conn, reply)
        if conn.node.phase == "closed":
            self._close(conn)
            return
        self._schedule(conn.node.rank)

    def _send(self, conn: _Conn, data: bytes) -> None:
        if data:
            conn.out += conn.link.wrap(data)
        if not conn.out or conn.closed:
            return
        try:
            n = conn.link.sock.send(conn.out)
        except BlockingIOError:
            n = 0
        except OSError:
            self._close(conn)
            return
        del conn.out[:n]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        with contextlib.suppress(KeyError, ValueError, OSError):
            if self.sel.get_key(conn.link.sock).events != events:
                self.sel.modify(conn.link.sock, events, conn.node.rank)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.sel.unregister(conn.link.sock)
        with contextlib.suppress(OSError):
            conn.link.sock.close()


def parse_ranks(text: str, known: range | None = None) -> list[int]:
    """``3``, ``0-99``, ``1,5,9`` or ``all`` (every rank of ``known``)."""
    out: list[int] = []
    for part in text.split(","):
        if part == "all" and known is not None:
            out.extend(known)
        elif "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfcluster_testbed.loadgen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--connect", required=True, help="the supervisor's HOST:PORT (TFCLUSTER_CONNECT)")
    ap.add_argument("--ranks", required=True, help="ranks to play: A-B or a list")
    ap.add_argument("--threads", type=int, default=2, help="selector loops (nodes are spread over them)")
    ap.add_argument("--dialers", type=int, default=16, help="handshakes at once")
    ap.add_argument("--log-rate", type=float, default=0.0, help="log lines per second per node once running")
    ap.add_argument("--max-s", type=float, default=3600.0, help="the generator ends by itself after this long")
    ap.add_argument("--cues", help="also read cues from this file (a FIFO another process writes)")
    ap.add_argument("--events", help="also append the events to this file")
    ap.add_argument("--attempt", type=int, default=0, help="the run's attempt these nodes were started for")
    args = ap.parse_args(argv)
    if args.events:
        _also.append(open(args.events, "a"))  # noqa: SIM115 - for the life of the process
    secret = bytes.fromhex(sys.stdin.readline().strip())
    address = parse_address(args.connect)
    ranks = parse_ranks(args.ranks)
    loops = [Loop(i, args.log_rate) for i in range(max(1, args.threads))]
    for lp in loops:
        lp.start()
    owner = {rank: loops[i % len(loops)] for i, rank in enumerate(ranks)}
    t0 = time.monotonic()
    failed: list[str] = []
    configs = ConfigCache()

    def one(rank: int) -> None:
        try:
            link = dial(address, secret, rank, attempt=args.attempt)
            config = configs.parse(link.config_line)
        except Exception as exc:  # a refused rank is the test's to judge: said, not raised
            failed.append(f"{rank}: {exc}")
            return
        owner[rank].post("add", rank, (link, config))

    with ThreadPoolExecutor(max_workers=max(1, args.dialers)) as pool:
        list(pool.map(one, ranks))
    say(
        event="dialed",
        ranks=len(ranks) - len(failed),
        failed=len(failed),
        errors=failed[:5],
        seconds=round(time.monotonic() - t0, 3),
    )
    known = range(min(ranks, default=0), max(ranks, default=-1) + 1)
    control = threading.Thread(target=_control, args=(sys.stdin, owner, known), daemon=True)
    control.start()
    if args.cues:
        threading.Thread(target=_control, args=(None, owner, known, args.cues), daemon=True).start()
    end = t0 + args.max_s
    while time.monotonic() < end and control.is_alive() and any(lp.live() for lp in loops):
        time.sleep(0.1)
    for lp in loops:
        lp.stopping = True
        lp.post("wake", -1)
    for lp in loops:
        lp.join(5)
    say(event="done", seconds=round(time.monotonic() - t0, 3))
    return 0


def _control(stream: IO[str] | None, owner: dict[int, Loop], known: range, path: str | None = None) -> None:
    """Cues, one a line, until ``quit`` or EOF (from ``stream``, or the file at ``path``)."""
    if stream is None and path is not None:
        with open(path) as f:  # a FIFO: blocks until its writer opens it
            _control(f, owner, known)
        return
    assert stream is not None
    for line in stream:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            return
        if len(words) < 2 or words[0] not in ("kill", "exit", "hang", "silent", "drop", "slow", "mark"):
            say(event="error", message=f"unknown cue: {line.strip()}")
            continue
        value = float(words[2]) if len(words) > 2 else None
        for rank in parse_ranks(words[1], known):
            if rank in owner:
                owner[rank].post("fault", rank, (words[0], value))
