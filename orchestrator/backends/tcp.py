"""Connect-back channels: nodes started by a scheduler dial the supervisor over TCP.

``ConnectBackServer`` listens; each connection must prove it holds the run's secret for one expected
rank (HMAC challenge, ``worker_entry.connect``), and gets the supervisor's proof back before it
receives its ``NodeConfig``. An authenticated connection becomes a ``SocketChannel``: the same
``Channel`` contract as an SSH exec channel, so the supervisor never knows which. Anything else —
a wrong secret, an unknown or duplicate rank, garbage, a slow handshake — is closed and recorded in
``rejected``. Handshakes are bounded in time, size and number.
"""

from __future__ import annotations

import abc
import contextlib
import hmac
import json
import secrets
import select
import socket
import threading
import time
from collections.abc import Mapping, Sequence

from worker_entry.connect import HANDSHAKE_VERSION, HandshakeError, mac, read_line
from worker_entry.protocol import NodeConfig, command_line
from worker_entry.protocol.env import Env

from ..core.diagnostics import Diagnostic
from ..plan import NodePlan
from .backend import Backend, Deliver
from .base import Channel

HANDSHAKE_TIMEOUT_S = 10.0
MAX_HANDSHAKES = 64
SEND_TIMEOUT_S = 30.0


class SocketChannel(Channel):
    """One task's connection to its node. EOF on the socket is the end of the task's stream."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        sock.setblocking(False)
        self._lock = threading.Lock()
        self._eof = False
        self._closed = False
        self.status: int | None = None  # set by a backend that learns the exit status elsewhere

    def filenos(self) -> list[int]:
        return [] if self._eof or self._closed else [self.sock.fileno()]

    def read(self) -> tuple[bytes, bytes, bool]:
        out = bytearray()
        while not self._eof and not self._closed:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._eof = True
                break
            out += data
        return bytes(out), b"", self._eof

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + SEND_TIMEOUT_S
        with self._lock:
            while view:
                if self._closed:
                    raise OSError("channel closed")
                try:
                    n = self.sock.send(view)
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(f"{self.peer}: send timed out") from None
                    select.select([], [self.sock], [], 1.0)
                    continue
                view = view[n:]

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


class ConnectBackServer:
    """Accepts nodes, authenticates them, hands each expected rank's channel to ``deliver``."""

    def __init__(self, secret: bytes, bind: tuple[str, int] = ("0.0.0.0", 0), advertise: str | None = None) -> None:
        self.secret = secret
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(bind)
        self.listener.listen(256)
        self.advertise = advertise or (bind[0] if bind[0] not in ("0.0.0.0", "::") else socket.getfqdn())
        self.expected: dict[int, tuple[str, NodeConfig]] = {}
        self.connected: set[int] = set()
        self.rejected: list[tuple[str, str]] = []  # (peer, why)
        self._deliver: Deliver | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="connect-back", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    @property
    def address(self) -> str:
        """HOST:PORT as the nodes must dial it (``TFCLUSTER_CONNECT``)."""
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return f"{host}:{self.port}"

    def expect(self, ranks: Mapping[int, tuple[str, NodeConfig]], deliver: Deliver) -> None:
        """From now on, rank r's node gets ``ranks[r]``'s config and its channel goes to ``deliver``."""
        with self._lock:
            self.expected = dict(ranks)
            self.connected = set()
            self._deliver = deliver

    def connected_ranks(self) -> set[int]:
        """Ranks that authenticated in the current ``expect`` round."""
        with self._lock:
            return set(self.connected)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, peer = self.listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            name = f"{peer[0]}:{peer[1]}"
            if not self._slots.acquire(blocking=False):
                self._reject(sock, name, "too many handshakes at once")
                continue
            threading.Thread(target=self._handshake, args=(sock, name), name="connect-back-hs", daemon=True).start()

    def _reject(self, sock: socket.socket, peer: str, why: str) -> None:
        with self._lock:
            if len(self.rejected) < 1000:
                self.rejected.append((peer, why))
        with contextlib.suppress(OSError):
            sock.close()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = secrets.token_hex(32)
            sock.sendall(json.dumps({"tfcluster": "connect", "v": HANDSHAKE_VERSION, "nonce": nonce}).encode() + b"\n")
            try:
                answer = json.loads(read_line(sock, 4096))
            except (ValueError, RecursionError):
                raise HandshakeError("not a tfcluster node") from None
            rank, theirs, their_mac = (answer.get(k) for k in ("rank", "nonce", "mac")) if isinstance(answer, dict) else (None,) * 3
            if not (isinstance(rank, int) and not isinstance(rank, bool) and isinstance(theirs, str) and isinstance(their_mac, str)):
                raise HandshakeError("not a tfcluster node")
            if not hmac.compare_digest(their_mac, mac(self.secret, b"node", nonce, theirs, rank)):
                raise HandshakeError(f"rank {rank}: wrong secret")
            with self._lock:
                target = self.expected.get(rank)
                if target is None:
                    raise HandshakeError(f"rank {rank} is not a task of this run")
                if rank in self.connected:
                    raise HandshakeError(f"rank {rank} is already connected")
                self.connected.add(rank)
                deliver = self._deliver
            task, config = target
            sock.sendall(json.dumps({"ok": True, "mac": mac(self.secret, b"supervisor", theirs, nonce, rank)}).encode() + b"\n")
            sock.sendall(command_line(config))
            sock.settimeout(None)
        except (OSError, HandshakeError) as exc:
            self._reject(sock, peer, str(exc))
            return
        finally:
            self._slots.release()
        if deliver is not None:
            deliver(task, SocketChannel(sock, peer))

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(2)


class ConnectBackBackend(Backend):
    """A backend whose nodes are started by someone else (a scheduler) and dial back.

    Subclasses implement ``launch``: start ``python -m worker_entry connect`` (or a scheduler mode)
    for every task, with ``connect_env`` in its environment and its rank (plan order) known to it."""

    name = "connect-back"
    reaches_nodes = False  # the nodes dial us once the scheduler starts them

    def __init__(self, bind: tuple[str, int] = ("0.0.0.0", 0), advertise: str | None = None) -> None:
        self.secret = secrets.token_bytes(32)
        self.server = ConnectBackServer(self.secret, bind, advertise)

    def connect_env(self) -> dict[str, str]:
        """What every node needs to dial back (the secret travels only in the environment)."""
        return {Env.CONNECT: self.server.address, Env.SECRET: self.secret.hex()}

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        return []

    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        self.server.expect({rank: (str(node.task), config) for rank, (node, config) in enumerate(starts)}, deliver)

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

    def close(self) -> None:
        self.server.close()

    def rejected(self) -> list[tuple[str, str]]:
        return list(self.server.rejected)

