"""Connect-back channels: nodes started by a scheduler dial the supervisor over TCP.

``ConnectBackServer`` listens (``handshakes``: every handshake on one selector, bounded in time and
memory, nothing an unproven peer can exhaust); each connection must prove it holds the run's secret
for one expected rank and gets the supervisor's proof back before it receives its ``NodeConfig``.
From then on every byte in both directions is a sealed record (``worker_entry.protocol.seal``:
AES-256-GCM, a key per direction derived from the secret and both nonces, a counter against replay).
A proven connection becomes a ``SocketChannel``: the same ``Channel`` contract as an SSH exec channel,
so the supervisor never knows which. Anything else is closed and counted (``refusals``).
"""

from __future__ import annotations

import abc
import contextlib
import queue
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Mapping, Sequence

from worker_entry.protocol import NodeConfig
from worker_entry.protocol.env import Env
from worker_entry.protocol.seal import Opener, Sealer, SealError

from ..core.diagnostics import Diagnostic
from ..plan import NodePlan
from .backend import Backend, Deliver, Placement
from .base import Channel
from .handshakes import HandshakeServer
from .refusals import Refusals

SEND_TIMEOUT_S = 30.0
READ_MAX = 1 << 20  # bytes one read() takes off the socket: the pump's work per call stays bounded
RECV_CHUNK = 256 << 10


class SocketChannel(Channel):
    """One task's connection to its node, sealed both ways. EOF on the socket ends the task's stream;
    a record that fails authentication ends it too (closed, with the reason on the channel's stderr)."""

    def __init__(self, sock: socket.socket, peer: str, sealer: Sealer, opener: Opener) -> None:
        self.sock = sock
        self.peer = peer
        sock.setblocking(False)
        self._sealer = sealer
        self._opener = opener
        self._lock = threading.Lock()
        self._waiter: selectors.BaseSelector | None = None
        self._eof = False
        self._closed = False
        self.status: int | None = None  # set by a backend that learns the exit status elsewhere

    def filenos(self) -> list[int]:
        return [] if self._eof or self._closed else [self.sock.fileno()]

    def read(self) -> tuple[bytes, bytes, bool]:
        """What arrived, opened. A recv that returns less than it asked for drained the socket: the next
        recv would only raise ``BlockingIOError`` (~2 µs a read, at 1,024 tasks nearly every read), so the
        read ends there; more that arrives meanwhile, or the EOF, makes the socket ready for the next pass."""
        chunks: list[bytes] = []
        size = 0
        while not self._eof and not self._closed and size < READ_MAX:
            want = min(RECV_CHUNK, READ_MAX - size)
            try:
                data = self.sock.recv(want)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._eof = True
                break
            chunks.append(data)
            size += len(data)
            if len(data) < want:
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            out = self._opener.feed(raw) if raw else b""
        except SealError as exc:
            self._eof = True
            self.close()
            return b"", f"tfcluster: connect-back channel from {self.peer}: {exc}; closed it\n".encode(), True
        err = b""
        if self._eof and self._opener.pending:
            err = f"tfcluster: connect-back channel from {self.peer}: cut in the middle of a record\n".encode()
        return out, err, self._eof

    def send(self, data: bytes) -> None:
        with self._lock:  # sealing and sending in one order: the record counter is the order
            if self._closed:
                raise OSError("channel closed")
            view = memoryview(self._sealer.seal(data))
            deadline = time.monotonic() + SEND_TIMEOUT_S
            while view:
                if self._closed:
                    raise OSError("channel closed")
                try:
                    n = self.sock.send(view)
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._close_locked()  # a record half sent: nothing after it could be opened
                        raise OSError(f"{self.peer}: send timed out") from None
                    self._wait_writable(min(left, 1.0))
                    continue
                view = view[n:]

    def _wait_writable(self, timeout: float) -> None:
        if self._waiter is None:
            self._waiter = selectors.DefaultSelector()
            self._waiter.register(self.sock, selectors.EVENT_WRITE)
        self._waiter.select(timeout)

    def exit_status(self) -> int | None:
        if self.status is not None:
            return self.status
        return -1 if self._eof or self._closed else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _close_locked(self) -> None:
        self.close()
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None


class ConnectBackServer:
    """Accepts nodes, authenticates them, hands each expected rank's channel to ``deliver``."""

    def __init__(self, secret: bytes, bind: tuple[str, int] = ("0.0.0.0", 0), advertise: str | None = None) -> None:
        self.secret = secret
        self.refusals = Refusals()
        self._deliver: Deliver | None = None
        self._again: dict[str, Deliver] = {}  # task -> where its restarted incarnation's channel goes
        self._lock = threading.Lock()
        self._proven: queue.SimpleQueue = queue.SimpleQueue()
        self.server = HandshakeServer(secret, bind, self._on_proven, self.refusals)
        self.advertise = advertise or (bind[0] if bind[0] not in ("0.0.0.0", "::") else socket.getfqdn())
        self._thread = threading.Thread(target=self._deliver_loop, name="connect-back-deliver", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        """HOST:PORT as the nodes must dial it (``TFCLUSTER_CONNECT``)."""
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return f"{host}:{self.port}"

    @property
    def rejected(self) -> list[tuple[str, str]]:
        """The recent refusals: (peer, why)."""
        return self.refusals.recent()

    def expect(self, ranks: Mapping[int, tuple[str, NodeConfig]], deliver: Deliver) -> None:
        """From now on, rank r's node gets ``ranks[r]``'s config and its channel goes to ``deliver``."""
        with self._lock:
            self._deliver = deliver
            self._again.clear()  # a restart of the last attempt that never connected is not this one's
            self.server.expect(ranks)

    def expect_again(self, rank: int, task: str, config: NodeConfig, deliver: Deliver) -> None:
        """Rank ``rank``'s node may connect once more (its task restarted in place): it gets ``config``
        and its channel goes to ``deliver``."""
        with self._lock:
            self._again[task] = deliver
            self.server.expect_again(rank, task, config)

    def forget_again(self, rank: int, task: str, deliver: Deliver) -> None:
        """A restart given up on (it failed to start, or its task was abandoned before it connected):
        its rank may not connect any more, and nothing goes to its ``deliver``."""
        with self._lock:
            if self._again.get(task) is deliver:
                del self._again[task]
            self.server.close_rank(rank)

    def connected_ranks(self) -> set[int]:
        """Ranks that authenticated in the current ``expect`` round."""
        return self.server.connected_ranks()

    def _on_proven(self, task: str, sock: socket.socket, peer: str, sealer: Sealer, opener: Opener) -> None:
        with self._lock:
            deliver = self._again.pop(task, None) or self._deliver
        self._proven.put((deliver, task, SocketChannel(sock, peer, sealer, opener)))

    def _deliver_loop(self) -> None:
        """Hands channels on outside the selector's thread: a busy supervisor never stalls a handshake."""
        while (item := self._proven.get()) is not None:
            deliver, task, chan = item
            if deliver is None:
                chan.close()
            else:
                deliver(task, chan)

    def close(self) -> None:
        self.server.close()
        self._proven.put(None)
        self._thread.join(2)


class ConnectBackBackend(Backend):
    """A backend whose nodes are started by someone else (a scheduler) and dial back.

    Subclasses implement ``launch``: start ``python -m worker_entry connect`` (or a scheduler mode)
    for every task, with ``connect_env`` in its environment, ``secret_input`` on its stdin and its rank
    (plan order) known to it."""

    name = "connect-back"
    reaches_nodes = False  # the nodes dial us once the scheduler starts them
    fds_per_task = 1  # its socket

    def __init__(self, bind: tuple[str, int] = ("0.0.0.0", 0), advertise: str | None = None) -> None:
        self.secret = secrets.token_bytes(32)
        self.server = ConnectBackServer(self.secret, bind, advertise)
        self._ranks: dict[str, int] = {}
        self._restarting: dict[str, tuple[int, Deliver]] = {}  # task -> its restart's rank and deliver

    def connect_env(self) -> dict[str, str]:
        """Where every node dials back (the secret is not here: ``secret_input``)."""
        return {Env.CONNECT: self.server.address}

    def secret_input(self) -> bytes:
        """What the nodes read on their stdin: the run's secret (never in an environment, where
        ``/proc/PID/environ`` and a scheduler's records would keep it)."""
        return self.secret.hex().encode() + b"\n"

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        return []

    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        self.server.expect({rank: (str(node.task), config) for rank, (node, config) in enumerate(starts)}, deliver)
        self._ranks = {str(node.task): rank for rank, (node, _) in enumerate(starts)}
        self._restarting.clear()

        def run() -> None:
            try:
                self.launch(starts)
            except Exception as exc:  # the scheduler refused: every task fails to start, with the reason
                for node, _ in starts:
                    deliver(str(node.task), exc)

        thread = threading.Thread(target=run, name=f"{self.name}-launch", daemon=True)
        thread.start()
        return thread

    @abc.abstractmethod
    def launch(self, starts: Sequence[tuple[NodePlan, NodeConfig]]) -> None:
        """Start worker_entry for every task (rank = position in ``starts``); may block until started."""

    def restart_task(self, node: NodePlan, config: NodeConfig, deliver: Deliver, placement: Placement) -> None:
        """The task's rank may dial once more, with ``config``; the scheduler starts it again
        (``relaunch``) in the background."""
        task = str(node.task)
        rank = self.rank_of(task)
        self._restarting[task] = (rank, deliver)
        self.server.expect_again(rank, task, config, deliver)

        def run() -> None:
            try:
                self.relaunch(rank, node, config, placement)
            except Exception as exc:  # the scheduler refused: the restart failed, with the reason
                self.server.forget_again(rank, task, deliver)
                deliver(task, exc)

        threading.Thread(target=run, name=f"{self.name}-relaunch", daemon=True).start()

    def abandon_restart(self, task: str) -> None:
        """The supervisor gave up on a restarted task before it connected: it may not connect later
        (into another restart's or attempt's place); the scheduler ends what it started for it."""
        rank, deliver = self._restarting.pop(task, (None, None))
        if rank is not None and deliver is not None:
            self.server.forget_again(rank, task, deliver)
            self.end_relaunch(task)

    def end_relaunch(self, task: str) -> None:
        """End what ``relaunch`` started for ``task`` (default: nothing)."""
        return None

    def rank_of(self, task: str) -> int:
        """The rank ``start_all`` gave ``task`` (its position in the attempt's starts)."""
        return self._ranks[task]

    def relaunch(self, rank: int, node: NodePlan, config: NodeConfig, placement: Placement) -> None:
        """Start worker_entry for one task again, dialing back as ``rank`` (``restarts_tasks``)."""
        raise OSError(f"{self.name} cannot restart one task")

    def close(self) -> None:
        self.server.close()

    def rejected(self) -> list[tuple[str, str]]:
        return self.server.rejected

    def refusals(self) -> Refusals:
        return self.server.refusals
