"""What the supervisor needs from a way of reaching a node: exec a process, talk to it, see it end."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectFailure(Exception):
    """Why a host could not be reached, distinguished so the user knows what to fix."""

    kind: str  # host_key_unknown | host_key_changed | auth | refused | timeout | dns | unreachable | key | ssh
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.message}" + (f" — {self.hint}" if self.hint else "")


class Channel(abc.ABC):
    """One remote process: its stdin, stdout, stderr and exit status."""

    @abc.abstractmethod
    def filenos(self) -> list[int]:
        """fds that poll readable when stdout/stderr data or EOF is available."""

    @abc.abstractmethod
    def read(self) -> tuple[bytes, bytes, bool]:
        """Non-blocking: (stdout bytes, stderr bytes, at_eof). at_eof once both streams ended."""

    @abc.abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the process's stdin; raises OSError when the channel is gone."""

    @abc.abstractmethod
    def exit_status(self) -> int | None:
        """The exit status once known (-1 if the connection died without one)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close stdin and the channel; the node side sees EOF and tears its task down."""


class Connection(abc.ABC):
    label: str

    @abc.abstractmethod
    def exec(self, argv: Sequence[str]) -> Channel:
        """Start argv on the node (through its login shell for SSH, quoted; directly for local)."""

    def run(self, argv: Sequence[str], stdin: bytes = b"", timeout: float = 60.0) -> tuple[int, bytes, bytes]:
        """Run to completion, feeding `stdin`; for short helper commands (probes, manifests)."""
        import select
        import time

        chan = self.exec(argv)
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                chan.send(stdin)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{' '.join(argv)} did not finish within {timeout:g}s on {self.label}")
                select.select(chan.filenos(), [], [], min(left, 1.0))
                o, e, eof = chan.read()
                out += o
                err += e
                if eof:
                    break
            status = chan.exit_status()
            while status is None and time.monotonic() < deadline:
                time.sleep(0.01)
                status = chan.exit_status()
            return (status if status is not None else -1), bytes(out), bytes(err)
        finally:
            chan.close()

    @abc.abstractmethod
    def is_alive(self) -> bool: ...

    @abc.abstractmethod
    def close(self) -> None: ...
