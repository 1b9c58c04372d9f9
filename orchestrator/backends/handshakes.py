"""The connect-back listener: every handshake on one selector, costing the supervisor nothing while it waits.

One thread owns a selector (epoll: no limit on descriptor numbers) holding the listening socket and
every connection that has not proven yet that it holds the run's secret. Each such connection has one
deadline for its whole handshake (``HANDSHAKE_TIMEOUT_S`` from its accept, however it trickles its
bytes), at most ``MAX_LINE`` bytes of state, and no thread. There is no slot to exhaust: beyond
``MAX_PENDING`` unproven connections — or when the process runs out of descriptors — the oldest is
dropped to make room for the newest, so a node that dials in always gets its turn, and a node that
lost it anyway dials again (``worker_entry.agent.modes.connect`` retries until its own deadline). When no
descriptor can be freed, accepting pauses with a backoff instead of spinning.

A node that proves itself gets the supervisor's proof and its ``NodeConfig`` — the first sealed
record — and its socket becomes a ``SocketChannel`` handed to ``deliver`` by a separate thread (the
selector never waits for the supervisor). Every refusal is counted in ``Refusals``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from worker_entry.protocol import NodeConfig, command_line
from worker_entry.protocol import handshake as hs
from worker_entry.protocol.seal import Opener, Sealer, channel_keys, check_available

from .refusals import Refusals

HANDSHAKE_TIMEOUT_S = 10.0  # an unproven connection's whole handshake, from its accept
REPLY_TIMEOUT_S = 30.0  # a proven node reading its reply and config (up to 1 MiB)
MAX_PENDING = 4096  # unproven connections held at once; beyond, the oldest is dropped
LISTEN_BACKLOG = 1024  # the kernel's queue of connections not yet accepted; at least the round's task count
ACCEPT_BATCH = 64  # accepts per wake-up, so expiring and replying go on under a flood
BACKOFF_S = (0.05, 1.0)  # accepting pauses this long (doubling) when no descriptor can be freed
_NO_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

#: What the server hands on: (task, socket, peer, sealer, opener) of a proven node.
Proven = Callable[[str, socket.socket, str, Sealer, Opener], None]


@dataclass(eq=False)
class _Conn:
    """One connection in its handshake (``reply`` set: proven, its reply is being written)."""

    sock: socket.socket
    peer: str
    deadline: float
    nonce: str
    inbuf: bytearray = field(default_factory=bytearray)
    out: bytes = b""
    rank: int | None = None
    proven: tuple[str, Sealer, Opener] | None = None  # task, sealer, opener once the reply is out


class HandshakeServer:
    """Listens, runs every handshake on one selector; a proven node's connection goes to ``on_proven``."""

    def __init__(self, secret: bytes, bind: tuple[str, int], on_proven: Proven, refusals: Refusals) -> None:
        check_available()  # no cryptography: say so before any node dials in
        self.secret = secret
        self.on_proven = on_proven
        self.refusals = refusals
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(bind)
        self.listener.listen(LISTEN_BACKLOG)
        self.listener.setblocking(False)
        self.expected: dict[int, tuple[str, NodeConfig]] = {}
        self.connected: set[int] = set()
        self.accept_errors = 0  # accept() failures for want of descriptors
        self.accept_pauses = 0  # ... after which accepting waited (nothing to drop): never a busy retry
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # accept order = deadline order
        self._replying: set[_Conn] = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._paused_until: float | None = None
        self._backoff = BACKOFF_S[0]
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="connect-back", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def expect(self, ranks: Mapping[int, tuple[str, NodeConfig]]) -> None:
        with self._lock:
            self.expected = dict(ranks)
            self.connected = set()
        # thousands of nodes may dial at once: a full queue drops their SYNs, each dropped one waits out
        # TCP's 1 s, 3 s, ... retransmits. Sized to the round (the kernel caps it at net.core.somaxconn).
        with contextlib.suppress(OSError):
            self.listener.listen(max(LISTEN_BACKLOG, len(ranks)))

    def expect_again(self, rank: int, task: str, config: NodeConfig) -> None:
        """Rank ``rank`` may connect once more (a task restarted in place), and gets ``config``."""
        with self._lock:
            self.expected[rank] = (task, config)
            self.connected.discard(rank)

    def close_rank(self, rank: int) -> None:
        """Rank ``rank`` may not connect again in this round (a restart given up on)."""
        with self._lock:
            self.connected.add(rank)

    def connected_ranks(self) -> set[int]:
        with self._lock:
            return set(self.connected)

    def pending(self) -> int:
        """Connections in their handshake now (unproven and replying)."""
        return len(self._pending) + len(self._replying)

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._closed:
                now = time.monotonic()
                self._expire(now)
                self._resume_accepting(now)
                for key, mask in self._sel.select(self._timeout(now)):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(key.data)
                    else:
                        self._read(key.data)
        finally:
            for conn in [*self._pending, *self._replying]:
                self._drop(conn)
            self._sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _timeout(self, now: float) -> float:
        due = [1.0]
        if self._pending:
            due.append(next(iter(self._pending)).deadline - now)
        if self._replying:
            due.append(min(c.deadline for c in self._replying) - now)
        if self._paused_until is not None:
            due.append(self._paused_until - now)
        return max(0.0, min(due))

    def _expire(self, now: float) -> None:
        while self._pending and (conn := next(iter(self._pending))).deadline <= now:
            self._refuse(conn, "handshake not completed in time")
        for conn in [c for c in self._replying if c.deadline <= now]:
            self._refuse(conn, f"rank {conn.rank}: did not read its configuration in time")

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in _NO_FDS:
                    continue  # ECONNABORTED and the like: that connection is gone, not the listener
                self.accept_errors += 1
                if self._pending:  # make room: the oldest unproven connection goes
                    self._refuse(next(iter(self._pending)), "dropped for a newer connection (out of file descriptors)")
                    continue
                self._pause_accepting()
                return
            self._backoff = BACKOFF_S[0]
            self._start(sock, f"{addr[0]}:{addr[1]}")

    def _pause_accepting(self) -> None:
        """Out of descriptors with nothing to free: wait (the listener stays readable; polling it would spin)."""
        self._sel.unregister(self.listener)
        self.accept_pauses += 1
        self._paused_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_S[1])

    def _resume_accepting(self, now: float) -> None:
        if self._paused_until is not None and now >= self._paused_until and not self._closed:
            self._paused_until = None
            self._sel.register(self.listener, selectors.EVENT_READ, None)

    def _start(self, sock: socket.socket, peer: str) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._refuse(next(iter(self._pending)), "dropped for a newer connection (too many handshakes)")
        nonce = hs.new_nonce()
        conn = _Conn(sock, peer, time.monotonic() + HANDSHAKE_TIMEOUT_S, nonce, out=hs.hello(nonce))
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sent = sock.send(conn.out)  # 80 bytes into an empty socket buffer: always all of them
        except OSError as exc:
            self.refusals.add(peer, f"connection failed: {exc.strerror or exc}")
            sock.close()
            return
        conn.out = conn.out[sent:]
        self._pending[conn] = None
        self._sel.register(sock, selectors.EVENT_WRITE if conn.out else selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(hs.MAX_LINE + 1 - len(conn.inbuf))
        except BlockingIOError:
            return
        except OSError as exc:
            self._refuse(conn, f"connection failed during the handshake: {exc.strerror or exc}")
            return
        if not data:
            why = (
                "a proven node closed before reading its configuration"
                if conn.proven
                else "connection closed during the handshake"
            )
            self._refuse(conn, why)
            return
        if conn.proven is not None:
            self._refuse(conn, f"rank {conn.rank}: sent data before its configuration")
            return
        conn.inbuf += data
        line, newline, rest = bytes(conn.inbuf).partition(b"\n")
        if not newline:
            if len(conn.inbuf) > hs.MAX_LINE:
                self._refuse(conn, "handshake line too long")
            return
        if rest:
            self._refuse(conn, "not a tfcluster node (data after its answer)")
            return
        self._answer(conn, line)

    def _answer(self, conn: _Conn, line: bytes) -> None:
        """Check the node's proof; reply with ours and its configuration, or refuse."""
        try:
            rank, attempt, theirs, their_mac = hs.parse_answer(line)
        except hs.HandshakeError as exc:
            self._refuse(conn, str(exc))
            return
        conn.rank = rank
        if not hs.same_mac(hs.mac(self.secret, b"node", conn.nonce, theirs, rank, attempt=attempt), their_mac):
            conn.out = hs.refused_unsigned("wrong secret")
            self._refuse_after_reply(conn, f"rank {rank}: wrong secret")
            return
        with self._lock:
            target = self.expected.get(rank)
            why = None if target is not None else f"rank {rank} is not a task of this run"
            if why is None and target is not None and target[1].attempt != attempt:
                why = f"rank {rank} dialed for attempt {attempt}, this is attempt {target[1].attempt}"
            if why is None and rank in self.connected:
                why = f"rank {rank} is already connected"
            if why is None:
                self.connected.add(rank)
        if why is not None or target is None:
            conn.out = hs.refused(self.secret, rank, conn.nonce, theirs, why or "", attempt)
            self._refuse_after_reply(conn, why or "")
            return
        to_node, to_supervisor = channel_keys(self.secret, conn.nonce, theirs, rank)
        sealer, opener = Sealer(to_node), Opener(to_supervisor)
        task, config = target
        conn.out = hs.accepted(self.secret, rank, conn.nonce, theirs, attempt) + sealer.seal(command_line(config))
        conn.proven = (task, sealer, opener)
        del self._pending[conn]
        self._replying.add(conn)
        conn.deadline = time.monotonic() + REPLY_TIMEOUT_S
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _refuse_after_reply(self, conn: _Conn, why: str) -> None:
        """A proven node with a wrong rank: tell it (signed, so it stops dialing), then close."""
        with contextlib.suppress(OSError):
            conn.sock.send(conn.out)  # a short line into an empty buffer; best effort
        self._refuse(conn, why)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._refuse(
                conn, f"rank {conn.rank}: connection failed while sending its configuration: {exc.strerror or exc}"
            )
            return
        conn.out = conn.out[sent:]
        if conn.out:
            return
        if conn.proven is None:  # the hello is out: now the node's answer
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        self._sel.unregister(conn.sock)
        self._replying.discard(conn)
        task, sealer, opener = conn.proven
        self.on_proven(task, conn.sock, conn.peer, sealer, opener)

    def _refuse(self, conn: _Conn, why: str) -> None:
        self.refusals.add(conn.peer, why)
        if conn.proven is not None and conn.rank is not None:
            with self._lock:
                self.connected.discard(conn.rank)  # it never got its configuration: it may dial again
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._pending.pop(conn, None)
        self._replying.discard(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self.listener.close()
