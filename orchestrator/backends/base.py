"""Channels and connections: what every backend gives the supervisor and the transfers.

A ``Channel`` is one task's byte pipe — an SSH exec channel, or a socket a node opened back to the
supervisor — with the same contract either way; the supervisor never knows which. A ``Connection``
runs short helper commands on one node (probes, file transfers).
"""

from __future__ import annotations

import abc
import selectors
import time
from collections.abc import Sequence

from ..core.diagnostics import Diagnostic

MAX_RUN_OUTPUT = 64 << 20  # a manifest of ~500k files
MAX_STDERR = 64 << 10


def wait_readable(fds: Sequence[int], timeout: float) -> None:
    """Until one of ``fds`` is readable or ``timeout`` passed: a selector, so any descriptor number
    works (``select.select`` fails from 1024 on, which a launcher with many channels reaches)."""
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout)


class OutputTooLarge(OSError):
    """A helper command printed more than the launcher accepts."""


class ConnectFailure(Exception):
    """Why a host could not be reached, distinguished so the user knows what to fix."""

    def __init__(self, kind: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.kind = (
            kind  # host_key_unknown | host_key_changed | auth | refused | timeout | dns | unreachable | key | ssh
        )
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f" — {self.hint}" if self.hint else "")

    def diagnostic(self, task: str | None = None, host: str | None = None) -> Diagnostic:
        return Diagnostic(self.message, self.hint, task=task, host=host, code=self.kind)


class Channel(abc.ABC):
    """One remote process: its stdin, stdout, stderr and exit status."""

    #: The node's hello answers the config sent as the channel opened, so its time measures the node's
    #: clock against ours (``supervise.clock``). A pod's hello was printed whenever its container started.
    times_hello: bool = True

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

    def close_confirmed(self, timeout_s: float) -> bool | None:
        """Close stdin, wait up to ``timeout_s`` for the remote process to exit, close the channel:
        True once it did, False if it did not in time (or the link died), None where this channel
        cannot tell (the scheduler ends those processes)."""
        self.close()
        return None


class Connection(abc.ABC):
    label: str

    @abc.abstractmethod
    def exec(self, argv: Sequence[str]) -> Channel:
        """Start argv on the node (through its login shell for SSH, quoted; directly for local)."""

    def run(
        self, argv: Sequence[str], stdin: bytes = b"", timeout: float = 60.0, max_output: int = MAX_RUN_OUTPUT
    ) -> tuple[int, bytes, bytes]:
        """Run to completion, feeding ``stdin``; for short helper commands (probes, manifests).

        What the node prints is bounded: stdout beyond ``max_output`` bytes ends the command with
        OutputTooLarge; stderr keeps its last 64 KiB."""
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
                wait_readable(chan.filenos(), min(left, 1.0))
                o, e, eof = chan.read()
                out += o
                err += e
                if len(out) > max_output:
                    raise OutputTooLarge(f"{' '.join(argv)} on {self.label} printed more than {max_output} bytes")
                if len(err) > MAX_STDERR:
                    del err[: len(err) - MAX_STDERR]
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
