"""`tfcluster check`'s link rounds: one-way latency and bandwidth of host pairs, over the TF port (stdlib).

Every task listens on its own TF port (the address and port its gRPC server binds a moment later, so
the probe takes the path the collectives take) before TensorFlow is imported. Rounds pair the hosts
as DLRover's network check does (its "check node health" design: pairs first, then the slowest with
the fastest), so a slow link can be told from a slow host: round 1 pairs ranks (0,1), (2,3), ...;
round 2 sorts the hosts by their round-1 bandwidth and pairs the slowest with the fastest; a further
round gives every host a second partner where it has only one (odd host counts), so each host is
judged by its best link (``orchestrator.job.checkjudge``). Rank 0 coordinates: after each round every
task reports its measured links to it and waits for the next round's pairs (a barrier, so pairs
never share a host while measuring).

A probe (the lower rank is the client): ``PINGS`` ping-pongs of 64 bytes (one-way latency: half the
median round trip), then one upload and one download sized from a 256 KiB trial to last about
``TARGET_S`` (bandwidth: bytes over the time to the last byte, less a round trip). A link's bandwidth
is the slower direction: ``tc tbf`` and most shapers limit what a host sends.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

PINGS = 20
TRIAL_BYTES = 256 * 1024
TARGET_S = 0.25
MAX_BYTES = 64 * 1024 * 1024
CHUNK = 256 * 1024
MAX_ROUNDS = 4
_LEN = struct.Struct("!Q")


class LinkError(RuntimeError):
    """A probe or the coordination failed (peer gone, timeout): the check reports it, never hangs."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), CHUNK))
        if not part:
            raise LinkError("the peer closed the connection")
        buf += part
    return bytes(buf)


def _drain(sock: socket.socket, n: int) -> None:
    """Read and discard exactly n bytes (no copy kept: the payload is what is measured)."""
    view = memoryview(bytearray(CHUNK))
    left = n
    while left:
        got = sock.recv_into(view, min(left, CHUNK))
        if not got:
            raise LinkError("the peer closed the connection")
        left -= got


def _send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _recv_line(sock: socket.socket, limit: int = 1 << 20) -> dict[str, Any]:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        b = sock.recv(1)
        if not b:
            raise LinkError("the peer closed the connection")
        buf += b
        if len(buf) > limit:
            raise LinkError("control line too long")
    obj = json.loads(buf)
    if not isinstance(obj, dict):
        raise LinkError("control line is not an object")
    return obj


def _send_payload(sock: socket.socket, n: int) -> None:
    block = memoryview(bytes(CHUNK))
    left = n
    while left:
        k = min(left, CHUNK)
        sock.sendall(block[:k])
        left -= k


# --- the two ends of a probe --------------------------------------------------------------------


def _serve_probe(sock: socket.socket) -> None:
    """Server side: echo pings, sink uploads (ack each), source downloads, until the client says done."""
    while True:
        op = _recv_exact(sock, 1)
        if op == b"p":
            sock.sendall(_recv_exact(sock, 63) + b"p")
        elif op == b"u":
            (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
            _drain(sock, min(n, MAX_BYTES))
            sock.sendall(b"k")
        elif op == b"d":
            (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
            _send_payload(sock, min(n, MAX_BYTES))
        elif op == b"q":
            sock.recv(1)  # the client closes first: the TIME_WAIT stays on its side, not on our TF port
            return
        else:
            raise LinkError(f"unknown probe op {op!r}")


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rate(sock: socket.socket, direction: bytes, rtt: float) -> float:
    """Bytes/s in one direction: a trial, then a transfer sized to last about TARGET_S."""

    def transfer(n: int) -> float:
        def go() -> None:
            sock.sendall(direction + _LEN.pack(n))
            if direction == b"u":
                _send_payload(sock, n)
                _recv_exact(sock, 1)
            else:
                _drain(sock, n)

        return max(_timed(go) - rtt, 1e-6)

    trial = TRIAL_BYTES / transfer(TRIAL_BYTES)
    n = int(min(MAX_BYTES, max(TRIAL_BYTES, trial * TARGET_S)))
    return n / transfer(n)


def probe(address: str, port: int, timeout_s: float) -> dict[str, float]:
    """Client side: latency and the two directions' rates to a peer's probe server."""
    with socket.create_connection((address, port), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_line(sock, {"op": "probe"})
        rtts = []
        payload = b"x" * 63
        for _ in range(PINGS):
            t0 = time.perf_counter()
            sock.sendall(b"p" + payload)
            _recv_exact(sock, 64)
            rtts.append(time.perf_counter() - t0)
        rtt = statistics.median(rtts)
        up = _rate(sock, b"u", rtt)
        down = _rate(sock, b"d", rtt)
        sock.sendall(b"q")
    return {"latency_s": rtt / 2, "up_Bps": up, "down_Bps": down, "bandwidth_Bps": min(up, down)}


# --- the rounds ---------------------------------------------------------------------------------


def first_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(0, n - 1, 2)]


def next_pairs(n: int, figures: dict[int, float], met: dict[int, set[int]], round_no: int) -> list[tuple[int, int]]:
    """The next round's pairs (lower rank first): round 2 pairs the slowest host (by its best link so
    far; a host not yet measured counts as slowest) with the fastest, avoiding pairs already measured;
    later rounds pair only hosts with fewer than two partners. [] when every host has two (or n < 3)."""
    if n < 3 or round_no > MAX_ROUNDS or all(len(met.get(i, ())) >= 2 for i in range(n)):
        return []
    order = sorted(range(n), key=lambda i: (figures.get(i, -1.0), i))  # slowest first
    pairs: list[tuple[int, int]] = []
    busy: set[int] = set()
    for a in order if round_no == 2 else [i for i in order if len(met.get(i, ())) < 2]:
        if a in busy:
            continue
        for b in reversed(order):  # the fastest free host a has not met
            if b != a and b not in busy and b not in met.get(a, set()):
                pairs.append((min(a, b), max(a, b)))
                busy.update((a, b))
                break
    return pairs


class Coordinator:
    """Rank 0's book of the rounds: collects every task's report, then answers all with the next pairs."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.round = 1
        self.reports: dict[int, list[dict[str, Any]]] = {}
        self.answer: dict[int, list[tuple[int, int]]] = {}
        self.figures: dict[int, float] = {}
        self.met: dict[int, set[int]] = {}

    def report(self, rank: int, round_no: int, links: list[dict[str, Any]], timeout_s: float) -> list[tuple[int, int]]:
        with self.cond:
            if round_no != self.round:
                raise LinkError(f"rank {rank} reported round {round_no} during round {self.round}")
            self.reports[rank] = links
            if len(self.reports) == self.n:
                for link in (x for ls in self.reports.values() for x in ls):
                    a, b, bw = int(link["ra"]), int(link["rb"]), float(link["bandwidth_Bps"])
                    for x, y in ((a, b), (b, a)):
                        self.met.setdefault(x, set()).add(y)
                        self.figures[x] = max(self.figures.get(x, 0.0), bw)
                self.answer[round_no] = next_pairs(self.n, self.figures, self.met, round_no + 1)
                self.reports = {}
                self.round += 1
                self.cond.notify_all()
            elif not self.cond.wait_for(lambda: round_no in self.answer, timeout=timeout_s):
                raise LinkError(f"round {round_no}: not every task reported within {timeout_s:.0f} s")
            return self.answer[round_no]


class ProbeServer:
    """This task's listener on its TF port: probes from its round's partner, reports (rank 0)."""

    def __init__(self, port: int, coordinator: Coordinator | None, timeout_s: float) -> None:
        self.coordinator = coordinator
        self.timeout_s = timeout_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", port))
        self.sock.listen(128)
        self.errors: list[str] = []
        self._handlers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._accept, name="check-probe", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            handler = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._handlers.append(handler)
            handler.start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                head = _recv_line(conn)
                if head.get("op") == "probe":
                    _serve_probe(conn)
                elif head.get("op") == "report" and self.coordinator is not None:
                    pairs = self.coordinator.report(
                        int(head["rank"]), int(head["round"]), list(head["links"]), self.timeout_s
                    )
                    _send_line(conn, {"pairs": pairs})
                    _recv_exact(conn, 1)  # the client closes first (its side keeps the TIME_WAIT)
        except (OSError, LinkError, ValueError, KeyError, TypeError) as exc:
            if not isinstance(exc, LinkError) or "closed" not in str(exc):
                self.errors.append(repr(exc))

    def close(self) -> None:
        """Free the port for TensorFlow: shutdown wakes the thread blocked in accept (a plain close
        would leave the listening socket open until accept returns)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)
        deadline = time.monotonic() + 2.0  # the accepted connections too: their clients are done and close
        for handler in self._handlers:
            handler.join(timeout=max(0.0, deadline - time.monotonic()))


def _report(
    coord: tuple[str, int], rank: int, round_no: int, links: list[dict[str, Any]], timeout_s: float
) -> list[tuple[int, int]]:
    with socket.create_connection(coord, timeout=timeout_s) as sock:
        _send_line(sock, {"op": "report", "rank": rank, "round": round_no, "links": links})
        answer = _recv_line(sock)
    return [(int(a), int(b)) for a, b in answer["pairs"]]


def link_rounds(peers: Sequence[tuple[str, str, int]], rank: int, deadline: float) -> list[dict[str, Any]]:
    """Run every round; the links this task measured as a client: ``{a, b, ra, rb, round, latency_s,
    bandwidth_Bps, up_Bps, down_Bps}`` (``a``/``b``: task names). ``peers``: (task, address, port) in
    rank order. Every wait is bounded by ``deadline`` (time.monotonic())."""
    n = len(peers)
    if n < 2:
        return []

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise LinkError("the check's deadline passed during the link rounds")
        return rest

    server = ProbeServer(peers[rank][2], Coordinator(n) if rank == 0 else None, left())
    mine: list[dict[str, Any]] = []
    try:
        # every listener must be up before the first probe: retry connecting until the deadline
        pairs, round_no = first_pairs(n), 1
        while True:
            links = []
            for a, b in pairs:
                if a == rank:
                    _, addr, port = peers[b]
                    figures = _retrying(lambda addr=addr, port=port: probe(addr, port, min(left(), 30.0)), left)
                    links.append({"a": peers[a][0], "b": peers[b][0], "ra": a, "rb": b, "round": round_no, **figures})
            mine += links
            pairs = _retrying(
                lambda r=round_no, ls=links: _report((peers[0][1], peers[0][2]), rank, r, ls, left()), left
            )
            if not pairs:
                return mine
            round_no += 1
    finally:
        server.close()


def _retrying(fn: Any, left: Any) -> Any:
    """fn(), retried while a peer's listener is not up yet (connection refused), within the deadline."""
    while True:
        try:
            return fn()
        except ConnectionRefusedError:
            time.sleep(min(0.05, left()))
