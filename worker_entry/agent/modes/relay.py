"""The sealed link on the node: the runner's plain byte stream ↔ sealed records on the supervisor's socket.

The runner speaks the same protocol over a connect-back socket as over SSH's stdin/stdout, so it gets
one end of a socketpair, and two threads here seal what it writes and open what the supervisor sends.
A record that fails authentication (forged, replayed, injected by someone on the path) ends the link:
the runner sees its launcher go (EOF) and stops the task, exactly as when the connection drops — it
never acts on a byte it could not authenticate.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from dataclasses import dataclass

from ...protocol.seal import Opener, Sealer, SealError

CHUNK = 256 << 10


@dataclass
class Link:
    """A proven connection to the supervisor: its socket, both directions' cipher state, the
    configuration line and any plaintext that followed it."""

    sock: socket.socket
    sealer: Sealer
    opener: Opener
    config_line: bytes
    rest: bytes = b""


class SealedRelay:
    """``fd``: the runner's end (plain bytes both ways); ``finish`` once the runner is done with it."""

    def __init__(self, link: Link) -> None:
        self.link = link
        inner, self.outer = socket.socketpair()
        self.fd = inner.detach()
        self.error: str | None = None
        self._to_node = threading.Thread(target=self._down, name="relay-to-node", daemon=True)
        self._to_supervisor = threading.Thread(target=self._up, name="relay-to-supervisor", daemon=True)
        self._to_node.start()
        self._to_supervisor.start()

    def _down(self) -> None:
        """Supervisor → runner: only authenticated bytes pass; EOF (or a bad record) is the runner's EOF."""
        link = self.link
        try:
            if link.rest:
                self.outer.sendall(link.rest)
            while data := link.sock.recv(CHUNK):
                plain = link.opener.feed(data)
                if plain:
                    self.outer.sendall(plain)
        except SealError as exc:
            self.error = str(exc)
            print(f"worker_entry: connect-back channel: {exc}; closing it", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.outer.shutdown(socket.SHUT_WR)

    def _up(self) -> None:
        """Runner → supervisor: every byte sealed, in order; a broken link breaks the runner's writes."""
        link = self.link
        try:
            while data := self.outer.recv(CHUNK):
                link.sock.sendall(link.sealer.seal(data))
        except OSError:
            with contextlib.suppress(OSError):
                self.outer.shutdown(socket.SHUT_RDWR)  # the runner's writer sees a broken channel
        finally:
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_WR)

    def finish(self, timeout: float) -> None:
        """The runner closed its end: send what it wrote (bounded by ``timeout``), then close."""
        self._to_supervisor.join(timeout)
        with contextlib.suppress(OSError):
            self.link.sock.shutdown(socket.SHUT_RDWR)
        self.link.sock.close()
        self._to_node.join(1.0)
        self.outer.close()
