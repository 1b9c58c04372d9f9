"""A Connection that runs commands as local subprocesses (tests only): a "node" is this machine with
its own HOME, so `~` paths of different nodes land in different directories. The e2e tiers use real
SSH; this is for transfer logic where a real worker_entry on the other end is what matters."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fakechannel import drain

from orchestrator.backends import Channel, Connection

REPO = Path(__file__).resolve().parent.parent


class LocalChannel(Channel):
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        assert proc.stdout and proc.stderr and proc.stdin
        self._open = [proc.stdout.fileno(), proc.stderr.fileno()]
        for fd in self._open:
            os.set_blocking(fd, False)

    def filenos(self) -> list[int]:
        return list(self._open)

    def read(self) -> tuple[bytes, bytes, bool]:
        out, err = drain(self._open, (self.proc.stdout.fileno(), self.proc.stderr.fileno()), close=False).values()
        return bytes(out), bytes(err), not self._open

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (ValueError, BrokenPipeError) as exc:
            raise OSError(str(exc)) from None

    def exit_status(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class LocalConnection(Connection):
    """``home``: this node's HOME. ``rewrite(argv, stdout) -> stdout`` lets a test play a hostile node."""

    def __init__(self, home: Path, rewrite: Callable[[Sequence[str]], bytes | None] | None = None) -> None:
        self.label = f"local:{home.name}"
        self.home = home
        self.rewrite = rewrite

    def exec(self, argv: Sequence[str]) -> LocalChannel:
        forged = self.rewrite(argv) if self.rewrite else None
        if forged is not None:
            argv = [sys.executable, "-c", f"import sys; sys.stdin.readline(); sys.stdout.buffer.write({forged!r})"]
        env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable if a == "python3" else a for a in argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        return LocalChannel(proc)

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        pass
