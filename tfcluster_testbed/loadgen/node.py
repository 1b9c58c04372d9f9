"""One fake node of the load generator: what worker_entry says on its channel, without a process.

A ``LoadNode`` is a protocol state machine and nothing else: commands in (the launcher's JSON lines),
frames out (``worker_entry.protocol``'s real frames and messages, validated by the real launcher), at
the times ``due`` names. The loop that owns the socket (``loop.py``) feeds it and sends what it
returns. What it says follows the real node's order: the sync marker and ``hello``; heartbeats every
``heartbeat_interval_s`` of its ``NodeConfig`` (``waiting`` before the go: every ``waiting_heartbeat_s``
when set); after the go ``spawned``, ``started``, heartbeats with ``progress``, step-clock ``profile`` windows (the config's
``TFCLUSTER_PROFILE_INTERVAL_S``) and log lines at the generator's rate; on a stop ``stopping``,
``exited``, ``task_files``; then it waits for ``bye``.

Faults on cue (``fault``): ``kill`` (its training process dies of SIGKILL: ``exited`` with the
signal), ``exit CODE`` (it ends by itself), ``hang`` (the process is stopped: heartbeats say state
``stopped``, no step), ``silent`` (nothing more at all: a host or link gone, the socket left open),
``drop`` (the connection closes without a word), ``slow FACTOR`` (its steps take FACTOR times longer,
outside the all-reduce: a straggler); and ``mark`` (a heartbeat at once whose state is ``mark-N``: the
start of a heartbeat-to-status measurement; the later heartbeats keep that state).
"""

from __future__ import annotations

import json
import time
from typing import Any

from worker_entry import protocol as p

STEP_MS = 50.0  # a healthy node's step
LOG_LINE = b"x" * 60


def _frame(obj: dict[str, Any]) -> bytes:
    return p.msg_frame(obj)


class LoadNode:
    """One rank's conversation with the supervisor (no I/O: ``feed`` and ``due`` return bytes to send)."""

    def __init__(self, rank: int, config: p.NodeConfig, *, log_rate: float = 0.0, now: float | None = None) -> None:
        self.rank = rank
        self.config = config
        self.interval = config.heartbeat_interval_s
        self.waiting_interval = config.waiting_heartbeat_s or self.interval  # before the go, as a real node
        try:
            self.profile_s = float(config.env.get(p.Env.PROFILE_INTERVAL_S, "0") or 0)
        except ValueError:
            self.profile_s = 0.0
        self.log_every = 1.0 / log_rate if log_rate > 0 else 0.0
        self.phase = "waiting"  # waiting | running | ended | closed
        self.fault: str | None = None
        self.slow = 1.0
        self.seq = 0
        self.steps = 0
        self.step_clock = 0.0  # fractional steps
        self.logged = 0  # bytes of LOG frames sent (the task_files' log_bytes)
        self.window_steps = 0
        self.marks = 0
        self._buf = b""
        now = time.monotonic() if now is None else now
        self.last_step_at = now
        self.next_beat = now
        self.next_profile = now + self.profile_s if self.profile_s > 0 else float("inf")
        self.next_log = now + self.log_every if self.log_every else float("inf")

    @property
    def task(self) -> dict[str, Any]:
        return self.config.task.to_dict()

    # --- what it says first ----------------------------------------------------------------------

    def start(self) -> bytes:
        facts = {"hostname": f"load-{self.rank}", "time": time.time(), "python": "3", "cpus": 2}
        hello = {
            "type": "hello",
            "pid": 10_000 + self.rank,
            "remote_dir": self.config.remote_dir,
            "facts": facts,
            "task": self.task,
        }
        return p.MARKER + _frame(hello)

    # --- commands in ---------------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> bytes:
        """The launcher's bytes: what to answer (commands are whole JSON lines)."""
        self._buf += data
        out = bytearray()
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                out += self._command(json.loads(line), now)
        return bytes(out)

    def _command(self, cmd: dict[str, Any], now: float) -> bytes:
        kind = cmd.get("type")
        if self.fault == "silent":
            return b""
        if kind == "go" and self.phase == "waiting":
            self.phase = "running"
            self.last_step_at = now
            self.next_beat = now  # a heartbeat at once, then the interval: as worker_entry's loop after the go
            pid = 20_000 + self.rank
            return _frame({"type": "spawned", "pid": pid}) + _frame({"type": "started", "how": "strategy"})
        if kind == "stop" and self.phase in ("waiting", "running"):
            return self._end(stopped=cmd)
        if kind == "bye":
            self.phase = "closed"
        return b""

    # --- the end --------------------------------------------------------------------------------------

    def _end(
        self, *, stopped: dict[str, Any] | None = None, code: int | None = None, signal: int | None = None
    ) -> bytes:
        out = b""
        ended = {"type": "exited", "ended": time.time()}
        if stopped is not None:
            if self.phase == "waiting":
                ended.update(not_started=True, reason="stopped before the go")
            else:
                sig = int(stopped.get("signal") or 15)
                out += _frame({"type": "stopping", "reason": str(stopped.get("reason") or "stopped")})
                ended.update(signal=sig, signal_name="SIGTERM" if sig == 15 else f"SIG{sig}", stopped=True)
        elif signal is not None:
            ended.update(signal=signal, signal_name="SIGKILL" if signal == 9 else f"SIG{signal}")
        else:
            ended.update(code=code or 0)
        self.phase = "ended"
        files: dict[str, Any] = {
            "type": "task_files",
            "log_bytes": self.logged,
            "task_dir": {"root": self.config.remote_dir, "exists": True, "files": []},
        }
        if self.config.checkpoint_dir:  # the chief lists its (empty) checkpoint directory
            files["checkpoint"] = {"root": self.config.checkpoint_dir, "exists": False, "files": []}
        return out + _frame(ended) + _frame(files)

    def apply(self, fault: str, arg: float | None, now: float) -> bytes:
        """A fault on cue; what it makes the node say at once."""
        if self.phase not in ("waiting", "running"):
            return b""
        if fault == "kill":
            return self._end(signal=9)
        if fault == "exit":
            return self._end(code=int(arg or 0))
        if fault == "slow":
            self.slow = float(arg or 2.0)
            return b""
        if fault == "mark":  # a heartbeat now, its state the mark (kept by the next ones): when does status show it?
            self.marks += 1
            return self._heartbeat()
        self.fault = fault  # hang | silent | drop (the loop closes the socket)
        return b""

    # --- on its own clock ---------------------------------------------------------------------------

    def due(self, now: float) -> bytes:
        """What is due by ``now`` (heartbeat, profile window, log lines)."""
        if self.phase not in ("waiting", "running") or self.fault in ("silent", "drop"):
            return b""
        out = bytearray()
        if self.phase == "running" and self.fault != "hang":
            self.step_clock += (now - self.last_step_at) * 1000.0 / (STEP_MS * self.slow)
            made = int(self.step_clock)
            self.step_clock -= made
            self.steps += made
            self.window_steps += made
        self.last_step_at = now
        if now >= self.next_beat:
            out += self._heartbeat()
            every = self.interval if self.phase == "running" else self.waiting_interval
            self.next_beat = max(self.next_beat + every, now)
        if self.phase == "running" and now >= self.next_profile:
            out += self._profile()
            self.next_profile = max(self.next_profile + self.profile_s, now)
        while self.phase == "running" and now >= self.next_log and self.fault != "hang":
            line = b"rank %d step %d " % (self.rank, self.steps) + LOG_LINE + b"\n"
            out += p.log_frame(p.STDOUT, line)
            self.logged += len(line)
            self.next_log += self.log_every
        return bytes(out)

    def next_due(self) -> float:
        if self.phase not in ("waiting", "running") or self.fault in ("silent", "drop"):
            return float("inf")
        due = self.next_beat
        if self.phase == "running":
            due = min(due, self.next_profile, self.next_log)
        return due

    def _heartbeat(self, state: str | None = None) -> bytes:
        self.seq += 1
        ts = time.time()
        beat: dict[str, Any] = {"type": "heartbeat", "seq": self.seq, "ts": ts, "load1": 0.5}
        if self.phase == "waiting":
            beat["state"] = "waiting"
            return _frame(beat)
        mark = f"mark-{self.marks}" if self.marks else "running"
        beat.update(
            state=state or ("stopped" if self.fault == "hang" else mark),
            cpu_pct=95.0,
            cpu_s=float(self.seq),
            rss_mb=512.0,
            threads=40,
            nproc=1,
        )
        step_ms = STEP_MS * self.slow
        beat["progress"] = {
            "steps": self.steps,
            "epoch": self.steps // 1000,
            "examples": self.steps * 64,
            "step_time_s": step_ms / 1000.0,
            "phase": "train",
            "ts": ts,
        }
        beat["host"] = {
            "interval_s": self.interval,
            "threads": 40,
            "run_ms": 950.0 * self.interval,
            "wait_ms": 5.0,
            "wait_pct": 0.5,
            "steal_pct": 0.0,
        }
        return _frame(beat)

    def _profile(self) -> bytes:
        steps, self.window_steps = self.window_steps, 0
        if steps < 5:  # the step clock needs a few steps per window
            return b""
        step = STEP_MS * self.slow
        extra = step - STEP_MS  # a slow node's excess is its own compute, before the all-reduce
        parts = {
            "input_ms": 2.0,
            "compute_ms": 30.0 + extra,
            "collective_ms": 12.0,
            "update_ms": 3.0,
            "host_ms": 2.0,
            "other_ms": 1.0,
        }
        record = {
            "type": "profile",
            "steps": steps,
            "ts": time.time(),
            "source": "stepclock",
            "step_ms": step,
            "pre_collective_ms": step - parts["collective_ms"],
            "cpu_ms": 28.0 + extra,
            "step_p50_ms": step,
            "stamps": "launch",
            **parts,
        }
        return _frame(record)
