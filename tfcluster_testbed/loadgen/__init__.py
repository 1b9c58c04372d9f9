"""A load generator that speaks the real protocol: N fake nodes dialing a supervisor over connect-back TCP.

Built to drive one real ``Supervisor``/``Job`` at thousands of tasks on one machine: the nodes live in
a separate process (``python -m tfcluster_testbed.loadgen``: ``loop.py``), many per thread, each
speaking ``worker_entry.protocol`` as a real worker_entry does (``node.py``) — hello, heartbeats at the
spec's interval, progress, profile windows, log lines at a chosen rate — and dying, hanging or
slowing down on cue. ``LoadGenerator`` here starts that process and talks to it (tests, benchmarks).

Unlike the rest of ``tfcluster_testbed`` this subpackage imports ``worker_entry`` (its protocol and its
connect-back handshake): the point is to speak exactly what the launcher reads. Nothing of
``orchestrator``; the package's ``__init__`` does not import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


class LoadGenerator:
    """One generator process playing ``ranks`` against the supervisor at ``address`` (HOST:PORT)."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        ranks: Sequence[int],
        *,
        threads: int = 2,
        dialers: int = 16,
        log_rate: float = 0.0,
        max_s: float = 3600.0,
        cues: str | None = None,
        events: str | None = None,
        attempt: int = 0,
    ) -> None:
        spec = (
            f"{min(ranks)}-{max(ranks)}"
            if list(ranks) == list(range(min(ranks), max(ranks) + 1))
            else ",".join(map(str, ranks))
        )
        argv = [
            sys.executable,
            "-m",
            "tfcluster_testbed.loadgen",
            "--connect",
            address,
            "--ranks",
            spec,
            "--threads",
            str(threads),
            "--dialers",
            str(dialers),
            "--log-rate",
            str(log_rate),
            "--max-s",
            str(max_s),
            *(["--cues", cues] if cues else []),
            *(["--events", events] if events else []),
            *(["--attempt", str(attempt)] if attempt else []),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        }
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.events: list[dict[str, Any]] = []
        self.stderr_tail = ""
        self._cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._readers:
            t.start()
        self._write(secret.hex())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _write(self, line: str) -> None:
        stdin: IO[str] | None = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line + "\n")
            stdin.flush()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                with self._cond:
                    self.events.append(obj)
                    self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail = (self.stderr_tail + line)[-8192:]

    def cue(self, fault: str, ranks: str | int, value: float | None = None) -> None:
        """``kill``, ``exit`` (value: the code), ``hang``, ``silent``, ``drop``, ``slow`` (value: the factor)."""
        self._write(f"{fault} {ranks}" + ("" if value is None else f" {value}"))

    def wait_event(self, name: str, timeout: float, **match: Any) -> dict[str, Any] | None:
        """The first event ``name`` (with ``match``'s fields), waiting up to ``timeout`` s for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if e.get("event") == name and all(e.get(k) == v for k, v in match.items()):
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._readers[0].is_alive()):
                    return None
                self._cond.wait(min(left, 0.5))

    def stop(self, timeout: float = 15.0) -> int:
        """End the generator (stdin closed: it closes every connection and exits); killed by PID if it
        does not. Returns its exit status."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        for t in self._readers:
            t.join(2)
        return rc


__all__ = ["LoadGenerator"]
