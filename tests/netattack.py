"""Attackers on a connect-back port, for tests: a slowloris and an on-path relay. Real sockets only.

``Slowloris`` holds N unauthenticated connections open and trickles one byte at a time into each (never
a newline), opening a new one whenever the server closes one — what a patient attacker on the cluster
network does. ``Relay`` sits on the path between a node and the supervisor, passes the handshake
through untouched, records every byte and can inject bytes into either direction afterwards.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable


class Slowloris:
    def __init__(self, port: int, n: int, host: str = "127.0.0.1", every_s: float = 0.5) -> None:
        self.addr = (host, port)
        self.n = n
        self.every_s = every_s
        self.socks: list[socket.socket] = []
        self.greeted = 0  # connections that got the supervisor's hello
        self.closed_on_us = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, name="slowloris", daemon=True)

    def __enter__(self) -> Slowloris:
        for _ in range(self.n):
            self.socks.append(self._open())
        return self

    def _open(self) -> socket.socket:
        s = socket.create_connection(self.addr, timeout=10)
        s.setblocking(False)
        return s

    def wait_greeted(self, timeout: float = 60.0) -> None:
        """Every connection has been accepted and got the server's first line (the condition, not a time);
        then the trickle starts."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            waiting = {s.fileno(): s for s in self.socks}
            for s in waiting.values():
                sel.register(s, selectors.EVENT_READ)
            while waiting and time.monotonic() < deadline:
                for key, _ in sel.select(1.0):
                    with contextlib.suppress(BlockingIOError):
                        key.fileobj.recv(4096)  # type: ignore[union-attr]
                    sel.unregister(key.fileobj)
                    waiting.pop(key.fd, None)
                    self.greeted += 1
        assert not waiting, f"{len(waiting)} of {self.n} connections were never greeted"
        self._thread.start()  # then the trickle: one byte at a time, never a newline

    def _trickle(self) -> None:
        while not self._stop.wait(self.every_s / max(1, len(self.socks))):
            if not self.socks:
                continue
            s = self.socks.pop(0)
            try:
                with contextlib.suppress(BlockingIOError):
                    while s.recv(4096):  # the hello again, or nothing
                        pass
                    raise ConnectionResetError  # recv returned b"": closed on us
                s.send(b"x")
                self.socks.append(s)
            except OSError:
                s.close()
                self.closed_on_us += 1
                with contextlib.suppress(OSError):
                    self.socks.append(self._open())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for s in self.socks:
            s.close()


class Relay:
    """node ⇄ relay ⇄ upstream, one connection at a time; ``inject(direction, data, when)``."""

    TO_NODE, TO_SUPERVISOR = "to_node", "to_supervisor"

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = {self.TO_NODE: bytearray(), self.TO_SUPERVISOR: bytearray()}
        self.injected = threading.Event()
        self._rule: tuple[str, Callable[[Relay], bytes], Callable[[Relay], bool]] | None = None
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._accept = threading.Thread(target=self._serve, name="relay", daemon=True)
        self._accept.start()

    def inject(self, direction: str, forge: Callable[[Relay], bytes], when: Callable[[Relay], bool]) -> None:
        """Once ``when(relay)`` holds after some bytes passed, write ``forge(relay)`` into ``direction``."""
        self._rule = (direction, forge, when)

    def _serve(self) -> None:
        while True:
            try:
                node, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            self._socks += [node, up]
            for src, dst, direction in ((node, up, self.TO_SUPERVISOR), (up, node, self.TO_NODE)):
                t = threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.seen[direction] += data
                    dst.sendall(data)
                    rule = self._rule
                    if rule is not None and not self.injected.is_set() and rule[2](self):
                        target = dst if rule[0] == direction else src
                        target.sendall(rule[1](self))
                        self.injected.set()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() (close alone does not: a 5 s join)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(5)
        self._accept.join(5)
