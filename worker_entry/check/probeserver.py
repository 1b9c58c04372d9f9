"""The check's probe server on a task's TF port: one thread, one selector, the job's tasks only.

It listens on the task's own TF address (the one TF_CONFIG names, the path the collectives take; all
interfaces only when that address is not local, said in the result) before TensorFlow binds the port.
Every connection first gets a fresh nonce and must answer with ``HMAC-SHA256(secret, nonce|head)``
(the per-run secret the launcher gives each check task in its environment, never on a command line):
a stranger on the port is closed at its first line, cannot take a rank's place in a round nor end
one, and is counted (``refused``). Connections are bounded (``max_conns``: when full, the oldest one
that has not authenticated within ``GRACE_S`` is closed to make room, so idle strangers cannot starve
the tasks, nor a flood evict a task between its nonce and its answer), each
must authenticate within ``AUTH_S`` and finish by the check's deadline, and no thread is made per
connection.

The wire (after the head): a probe's ops ``p`` (64-byte ping-pong), ``u`` (an 8-byte length, then
that many bytes, acknowledged with ``k``: the server times it — ``served``, its own view of the
upload, which the launcher holds the client's figure to), ``d`` (an 8-byte length; that many bytes
back), ``q`` (done: the client closes first, so the TIME_WAIT stays off the TF port). A report's
answer (rank 0, the coordinator) waits until every rank of the round has reported, without blocking
the loop.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import selectors
import socket
import struct
import threading
import time
from typing import Any

AUTH_S = 10.0
GRACE_S = 2.0  # an unauthenticated connection is not made room from before this (see ``_accept``)
DRAIN_S = 2.0  # at close, how long the probes still being served may take to say ``q``
CHUNK = 256 * 1024
MAX_BYTES = 64 * 1024 * 1024
HEAD_MAX = 1 << 20
_LEN = struct.Struct("!Q")
_ZEROS = memoryview(bytes(CHUNK))


class LinkError(RuntimeError):
    """A probe or the coordination failed (peer gone, timeout, refused): the check reports it, never hangs."""


def sign(secret: bytes, nonce: str, body: dict[str, Any]) -> str:
    """The MAC of a head (its fields but ``mac``) under the server's nonce."""
    text = json.dumps({k: v for k, v in body.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, f"{nonce}|{text}".encode(), hashlib.sha256).hexdigest()


class Coordinator:
    """Rank 0's book of the rounds: every rank's report, then the next pairs for all (``answer``)."""

    def __init__(self, n: int, next_pairs: Any) -> None:
        self.n = n
        self.next_pairs = next_pairs
        self.round = 1
        self.reports: dict[int, list[dict[str, Any]]] = {}
        self.figures: dict[int, float] = {}
        self.met: dict[int, set[int]] = {}

    def report(self, rank: int, round_no: int, links: list[Any]) -> list[tuple[int, int]] | None:
        """Record a rank's report; the next pairs once every rank of the round reported (else None)."""
        if round_no != self.round or not 0 <= rank < self.n:
            raise LinkError(f"rank {rank} reported round {round_no} during round {self.round}")
        self.reports[rank] = links
        if len(self.reports) < self.n:
            return None
        for link in (x for ls in self.reports.values() for x in ls if isinstance(x, dict)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                a, b, bw = int(link["ra"]), int(link["rb"]), float(link["bandwidth_Bps"])
                if not (0 <= a < self.n and 0 <= b < self.n and bw == bw):
                    continue
                for x, y in ((a, b), (b, a)):
                    self.met.setdefault(x, set()).add(y)
                    self.figures[x] = max(self.figures.get(x, 0.0), bw)
        self.reports = {}
        self.round += 1
        return self.next_pairs(self.n, self.figures, self.met, round_no + 1)


class _Conn:
    def __init__(self, sock: socket.socket, nonce: str, now: float) -> None:
        self.sock = sock
        self.nonce = nonce
        self.inbuf = bytearray()
        self.out = bytearray()
        self.head: dict[str, Any] | None = None
        self.auth_by = now + AUTH_S
        self.drain = 0  # upload bytes still to read
        self.drain_n = 0
        self.drain_t0 = 0.0
        self.source = 0  # download bytes still to send
        self.closing = False  # wait for the client's close
        self.best_up: tuple[int, float] | None = None  # (bytes, seconds) of its largest upload


class ProbeServer:
    """This task's listener on its TF port: probes from its round's partners, reports (rank 0)."""

    def __init__(
        self,
        address: str,
        port: int,
        secret: bytes,
        me: str,
        ranks: list[str],
        coordinator: Coordinator | None,
        deadline: float,
        max_conns: int = 64,
    ) -> None:
        self.secret, self.me, self.ranks, self.coordinator = secret, me, ranks, coordinator
        self.deadline, self.max_conns = deadline, max_conns
        self.sel = selectors.DefaultSelector()
        self.sock, self.bound = _listen(address, port)
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self.conns: dict[int, _Conn] = {}
        self.errors: list[str] = []
        self.refused = 0
        self.served: list[dict[str, Any]] = []
        self.waiting: list[_Conn] = []  # reports waiting for their round's answer
        self._wake_r, self._wake_w = os.pipe()
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self._drain_until = 0.0
        self._thread = threading.Thread(target=self._loop, name="check-probe", daemon=True)
        self._thread.start()

    # --- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop or (self._serving() and time.monotonic() < self._drain_until):
            now = time.monotonic()
            for key, events in self.sel.select(timeout=0.5):
                if key.data is None:
                    self._accept(now)
                elif key.data == "wake":
                    os.read(self._wake_r, 64)
                else:
                    self._event(key.data, events)
            now = time.monotonic()
            for c in list(self.conns.values()):
                if (c.head is None and now > c.auth_by) or now > self.deadline:
                    self._drop(c, "did not authenticate in time" if c.head is None else None)

    def _accept(self, now: float) -> None:
        try:
            sock, _ = self.sock.accept()
        except OSError:
            return
        if len(self.conns) >= self.max_conns:
            # bounded: the oldest connection that has not proved the secret makes room once it had
            # GRACE_S to (a task answers its nonce within a round trip, a loaded host's too; evicted
            # sooner, a task lost its probe or report to a flood: LinkError); until then the newcomer
            # is closed before its nonce, which a task's dialer retries. Idle strangers churn among
            # themselves.
            idle = [c for c in self.conns.values() if c.head is None]
            oldest = min(idle, key=lambda c: c.auth_by, default=None)
            self.refused += 1
            if oldest is None or now < oldest.auth_by - AUTH_S + GRACE_S:
                sock.close()
                return
            self._drop(oldest, None)
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = _Conn(sock, os.urandom(16).hex(), now)
        c.out += json.dumps({"nonce": c.nonce}).encode() + b"\n"
        self.conns[sock.fileno()] = c
        self.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def _event(self, c: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._write(c)
            if events & selectors.EVENT_READ and c.sock.fileno() >= 0:
                self._read(c)
        except BlockingIOError:
            pass
        except (OSError, LinkError, ValueError, KeyError, TypeError) as exc:
            self._drop(c, None if isinstance(exc, ConnectionError) else repr(exc)[:300])

    def _write(self, c: _Conn) -> None:
        try:
            while c.out or c.source:
                if c.out:
                    sent = c.sock.send(c.out)
                    del c.out[:sent]
                else:
                    sent = c.sock.send(_ZEROS[: min(c.source, CHUNK)])
                    c.source -= sent
                if not sent:
                    break
        except BlockingIOError:
            pass  # the socket's buffer is full: the selector says when it drained
        self._interest(c)

    def _interest(self, c: _Conn) -> None:
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out or c.source else 0)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.modify(c.sock, want, c)

    def _read(self, c: _Conn) -> None:
        if c.drain:
            got = c.sock.recv(min(c.drain, CHUNK))
            if not got:
                raise ConnectionResetError
            c.drain -= len(got)
            if not c.drain:
                took = time.perf_counter() - c.drain_t0
                if c.best_up is None or c.drain_n >= c.best_up[0]:
                    c.best_up = (c.drain_n, took)
                c.out += b"k"
                self._interest(c)
            return
        data = c.sock.recv(CHUNK)
        if not data:
            self._drop(c, None)
            return
        c.inbuf += data
        if c.head is None:
            self._head(c)
        while c.head is not None and c.inbuf and not c.drain and not c.closing:
            if not self._op(c):
                break

    def _head(self, c: _Conn) -> None:
        line, sep, rest = bytes(c.inbuf).partition(b"\n")
        if not sep:
            if len(c.inbuf) > HEAD_MAX:
                raise LinkError("head line too long")
            return
        head = json.loads(line)
        if not isinstance(head, dict) or not hmac.compare_digest(
            str(head.get("mac", "")), sign(self.secret, c.nonce, head)
        ):
            self.refused += 1
            self._drop(c, None)  # a stranger, or a peer without the run's secret: not a word more
            return
        c.head = head
        c.inbuf = bytearray(rest)
        if head.get("op") == "report":
            self._report(c, head)
        elif head.get("op") != "probe":
            raise LinkError(f"unknown op {head.get('op')!r}")

    def _op(self, c: _Conn) -> bool:
        """One probe op from the buffer (False: not complete yet)."""
        op = c.inbuf[:1]
        if op == b"p":
            if len(c.inbuf) < 64:
                return False
            c.out += c.inbuf[1:64] + b"p"
            del c.inbuf[:64]
        elif op in (b"u", b"d"):
            if len(c.inbuf) < 1 + _LEN.size:
                return False
            (n,) = _LEN.unpack(bytes(c.inbuf[1 : 1 + _LEN.size]))
            n = min(n, MAX_BYTES)
            del c.inbuf[: 1 + _LEN.size]
            if op == b"d":
                c.source += n
            else:
                early = min(n, len(c.inbuf))
                del c.inbuf[:early]
                c.drain, c.drain_n, c.drain_t0 = n - early, n, time.perf_counter()
                if not c.drain:
                    c.out += b"k"
        elif op == b"q":
            c.closing = True
            self._record_served(c)
            del c.inbuf[:]
            return False
        else:
            raise LinkError(f"unknown probe op {bytes(op)!r}")
        self._interest(c)
        return True

    def _record_served(self, c: _Conn) -> None:
        head = c.head or {}
        rank, rnd = head.get("rank"), head.get("round")
        if c.best_up is None or not isinstance(rank, int) or not 0 <= rank < len(self.ranks):
            return
        n, took = c.best_up
        if took > 0 and isinstance(rnd, int):
            self.served.append({"a": self.ranks[rank], "b": self.me, "round": rnd, "up_Bps": n / took})

    def _report(self, c: _Conn, head: dict[str, Any]) -> None:
        if self.coordinator is None:
            raise LinkError("a report to a task that does not coordinate")
        links = head.get("links")
        pairs = self.coordinator.report(int(head["rank"]), int(head["round"]), links if isinstance(links, list) else [])
        self.waiting.append(c)
        if pairs is None:
            return
        answer = json.dumps({"pairs": pairs}).encode() + b"\n"
        for w in self.waiting:
            if w.sock.fileno() >= 0:
                w.out += answer
                w.closing = True
                self._interest(w)
        self.waiting = []

    def _drop(self, c: _Conn, why: str | None) -> None:
        if why:
            self.errors.append(why)
        self.conns.pop(c.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        c.sock.close()
        if c in self.waiting:
            self.waiting.remove(c)

    def _serving(self) -> bool:
        """A partner's probe is still open here (its ``q`` not read yet, its view of the upload not kept)."""
        return any(c.head is not None and c.head.get("op") == "probe" and not c.closing for c in self.conns.values())

    def close(self) -> None:
        """Free the port for TensorFlow once the probes served here have ended: the last round's client
        sends ``q`` just before its report, and the round may end before this loop read it (a busy host,
        a flood of strangers to accept): its ``served`` record would be lost. At most ``DRAIN_S``."""
        self._drain_until = time.monotonic() + DRAIN_S
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for c in list(self.conns.values()):
            self._drop(c, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.sock)
        self.sock.close()
        self.sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _listen(address: str, port: int) -> tuple[socket.socket, str]:
    """A listener on ``address`` (this task's TF address); all interfaces only where that address is
    not one of this host's (a name behind NAT): (the socket, what it bound, for the result)."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        infos = []
    for family, _, _, _, where in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise
            continue
        sock.listen(512)
        return sock, f"{where[0]}:{port}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", port))
    sock.listen(512)
    return sock, f"all interfaces:{port} ({address} is not an address of this host)"
