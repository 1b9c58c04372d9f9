"""Local transport: the node is this machine, the process a subprocess. Same Channel contract as SSH."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence

from .base import Channel, Connection


class LocalChannel(Channel):
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        assert proc.stdout and proc.stderr and proc.stdin
        self._out = proc.stdout.fileno()
        self._err = proc.stderr.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)
        self._open = [self._out, self._err]

    def filenos(self) -> list[int]:
        return list(self._open)

    def read(self) -> tuple[bytes, bytes, bool]:
        chunks = {self._out: bytearray(), self._err: bytearray()}
        for fd in list(self._open):
            while True:
                try:
                    data = os.read(fd, 1 << 20)
                except BlockingIOError:
                    break
                if not data:
                    self._open.remove(fd)
                    break
                chunks[fd] += data
        return bytes(chunks[self._out]), bytes(chunks[self._err]), not self._open

    def send(self, data: bytes) -> None:
        assert self.proc.stdin
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except ValueError as exc:  # closed file
            raise OSError(str(exc)) from None

    def exit_status(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin
            self.proc.stdin.close()


class LocalConnection(Connection):
    def __init__(self, label: str = "localhost") -> None:
        self.label = label

    def exec(self, argv: Sequence[str]) -> LocalChannel:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        )
        return LocalChannel(proc)

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        pass
