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
is the slower direction: ``tc tbf`` and most shapers limit what a host sends. The server end
(``probeserver``) admits only the job's tasks (each connection proves the run's secret) and times the
upload it receives: the launcher holds each client's figure to that (``served``), so a node that
lies about its links cannot make another host's look good or bad on its own.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import time
from collections.abc import Sequence
from typing import Any

from .probeserver import Coordinator, LinkError, ProbeServer, sign

PINGS = 20
TRIAL_BYTES = 256 * 1024
TARGET_S = 0.25
MAX_BYTES = 64 * 1024 * 1024
CHUNK = 256 * 1024
MAX_ROUNDS = 4
_LEN = struct.Struct("!Q")


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


# --- the client end of a probe ------------------------------------------------------------


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


def _open(address: str, port: int, timeout_s: float, secret: bytes, head: dict[str, Any]) -> socket.socket:
    """A connection to a peer's probe server, authenticated: its nonce, then our signed head."""
    sock = socket.create_connection((address, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            nonce = str(_recv_line(sock, 4096).get("nonce", ""))
        except LinkError:  # closed before its nonce: the server made room for others; try again
            raise ConnectionRefusedError("the probe server closed the connection before its nonce") from None
        _send_line(sock, {**head, "mac": sign(secret, nonce, head)})
    except BaseException:
        sock.close()
        raise
    return sock


def probe(address: str, port: int, timeout_s: float, secret: bytes, rank: int, round_no: int) -> dict[str, float]:
    """Client side: latency and the two directions' rates to a peer's probe server."""
    with _open(address, port, timeout_s, secret, {"op": "probe", "rank": rank, "round": round_no}) as sock:
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


def _report(
    coord: tuple[str, int], secret: bytes, rank: int, round_no: int, links: list[dict[str, Any]], timeout_s: float
) -> list[tuple[int, int]]:
    head = {"op": "report", "rank": rank, "round": round_no, "links": links}
    with _open(coord[0], coord[1], timeout_s, secret, head) as sock:
        answer = _recv_line(sock)
    return [(int(a), int(b)) for a, b in answer["pairs"]]


def link_rounds(peers: Sequence[tuple[str, str, int]], rank: int, deadline: float, secret: bytes) -> dict[str, Any]:
    """Run every round: ``links``, those this task measured as a client (``{a, b, ra, rb, round,
    latency_s, bandwidth_Bps, up_Bps, down_Bps}``, ``a``/``b``: task names); ``served``, its own view
    of the probes it served; ``probe_bind``, where it listened; ``probe_refused``, connections it
    closed unheard (strangers). ``peers``: (task, address, port) in rank order; ``secret``: the run's
    (every connection proves it). Every wait is bounded by ``deadline`` (time.monotonic())."""
    n = len(peers)
    if n < 2:
        return {"links": [], "served": []}

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise LinkError("the check's deadline passed during the link rounds")
        return rest

    left()
    server = ProbeServer(
        peers[rank][1],
        peers[rank][2],
        secret,
        peers[rank][0],
        [p[0] for p in peers],
        Coordinator(n, next_pairs) if rank == 0 else None,
        deadline,
        max_conns=n + 32,
    )
    mine: list[dict[str, Any]] = []
    try:
        # every listener must be up before the first probe: retry connecting until the deadline
        pairs, round_no = first_pairs(n), 1
        while True:
            links = []
            for a, b in pairs:
                if a == rank:
                    _, addr, port = peers[b]
                    figures = _retrying(
                        lambda addr=addr, port=port, r=round_no: probe(addr, port, min(left(), 30.0), secret, rank, r),
                        left,
                    )
                    links.append({"a": peers[a][0], "b": peers[b][0], "ra": a, "rb": b, "round": round_no, **figures})
            mine += links
            pairs = _retrying(
                lambda r=round_no, ls=links: _report((peers[0][1], peers[0][2]), secret, rank, r, ls, left()), left
            )
            if not pairs:
                break
            round_no += 1
    finally:
        server.close()
    return {"links": mine, "served": server.served, "probe_bind": server.bound, "probe_refused": server.refused}


def _retrying(fn: Any, left: Any) -> Any:
    """fn(), retried while a peer's listener is not up yet (connection refused), within the deadline."""
    while True:
        try:
            return fn()
        except ConnectionRefusedError:
            time.sleep(min(0.05, left()))
