"""The supervisor loop of one attempt: start every task, route what they say, decide, tear down.

Inputs arrive on one queue (a pump thread selects over every channel); this loop is the only
place that changes task state, so decisions are simple and ordered. Policy lives in monitor.py,
cross-host rules in checks.py; here is only the wiring and the lifecycle.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from worker_entry import wire

from .checks import Finding, evaluate
from .events import EventBus
from .monitor import Monitor, Policy, Verdict
from .plan import NodePlan, Plan
from .result import AttemptResult, Failure, JobState, TaskResult, TaskState
from .sinks import HeartbeatFile, LogRouter
from .spec import ClusterSpec
from .transport import Channel, Connection

TAIL_BYTES = 16 * 1024
LAST_LINES = 20
TEARDOWN_MARGIN_S = 5.0


class Interrupt:
    """Set from signal handlers (SIGINT/SIGTERM on the launcher), read by the loop."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    def trigger(self, signum: int) -> None:
        self.signum = signum
        self.count += 1


class ChannelPump(threading.Thread):
    """Selects over every channel and queues what arrives; the loop never blocks on one host."""

    def __init__(self, out: queue.Queue) -> None:
        super().__init__(name="channel-pump", daemon=True)
        self.out = out
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False

    def add(self, key: str, chan: Channel) -> None:
        with self._lock:
            self._channels[key] = chan
        os.write(self._wake_w, b"x")

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def run(self) -> None:
        try:
            while not self._stop:
                with self._lock:
                    fdmap: dict[int, str] = {}
                    for key, chan in self._channels.items():
                        for fd in chan.filenos():
                            fdmap[fd] = key
                try:
                    ready, _, _ = select.select([self._wake_r, *fdmap], [], [], 1.0)
                except (OSError, ValueError):
                    time.sleep(0.05)
                    continue
                for fd in ready:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        continue
                    key = fdmap[fd]
                    with self._lock:
                        chan = self._channels.get(key)
                    if chan is None:
                        continue
                    try:
                        out, err, eof = chan.read()
                    except Exception as exc:  # a broken channel is an EOF with a reason
                        out, err, eof = b"", f"channel error: {exc}\n".encode(), True
                    if out or err or eof:
                        self.out.put(("data", key, out, err, eof))
                    if eof:
                        with self._lock:
                            self._channels.pop(key, None)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)


@dataclass
class Worker:
    """The live task (the plan's NodePlan is its blueprint)."""

    node: NodePlan
    conn: Connection | None
    state: TaskState = TaskState.PENDING
    chan: Channel | None = None
    decoder: wire.FrameDecoder = field(default_factory=wire.FrameDecoder)
    facts: dict[str, Any] | None = None
    pid: int | None = None
    started_how: str | None = None
    last_hb: dict[str, Any] = field(default_factory=dict)
    last_hb_wall: float | None = None
    profile: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    stop_sent: bool = False
    sent_config_at: float | None = None
    skew_s: float | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    tail_bytes: int = 0
    diag: bytearray = field(default_factory=bytearray)  # worker_entry's own stderr (and shell noise)

    @property
    def task(self) -> str:
        return str(self.node.task)

    @property
    def host(self) -> str:
        return self.node.host

    def remember(self, data: bytes) -> None:
        self.tail.append(data)
        self.tail_bytes += len(data)
        while self.tail_bytes > TAIL_BYTES and len(self.tail) > 1:
            self.tail_bytes -= len(self.tail.popleft())

    def last_lines(self, n: int = LAST_LINES) -> tuple[str, ...]:
        text = b"".join(self.tail).decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines and self.diag:
            lines = self.diag.decode("utf-8", "replace").splitlines()
        return tuple(lines[-n:])


class Supervisor:
    def __init__(
        self,
        spec: ClusterSpec,
        plan: Plan,
        conns: dict[str, Connection],
        *,
        attempt: int,
        bus: EventBus,
        logs: LogRouter,
        heartbeats: HeartbeatFile,
        interrupt: Interrupt,
        preflight: bool = True,
        on_status: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.attempt = attempt
        self.bus = bus
        self.logs = logs
        self.heartbeats = heartbeats
        self.interrupt = interrupt
        self.preflight = preflight
        self.on_status = on_status
        self.clock = clock
        self.policy = Policy.from_spec(spec)
        self.workers = {str(n.task): Worker(n, conns.get(str(n.task))) for n in plan.nodes}
        self.q: queue.Queue = queue.Queue()
        self.pump = ChannelPump(self.q)
        self.failures: list[Failure] = []
        self.state = JobState.STARTING
        self.stopping_reason: str | None = None
        self.teardown_deadline: float | None = None
        self.interrupted_by: int | None = None
        self.went_at: float | None = None
        self.started_ts = time.time()
        self.monitor = Monitor(list(self.workers), self.policy, clock())
        self.findings: list[Finding] = []
        self._handled_interrupts = 0

    # --- start -------------------------------------------------------------------------------

    def _exec_one(self, w: Worker) -> tuple[Worker, Exception | None]:
        try:
            if w.conn is None:
                raise OSError("not connected")
            chan = w.conn.exec(w.node.argv)
            config = w.node.worker_config(attempt=self.attempt, spec=self.spec, wait_for_go=True)
            w.sent_config_at = time.time()
            chan.send(wire.command_line(config))
            w.chan = chan
            return w, None
        except Exception as exc:
            return w, exc

    def _start(self) -> None:
        self.pump.start()
        self.bus.emit("attempt_started", attempt=self.attempt)
        with ThreadPoolExecutor(max_workers=min(64, len(self.workers))) as pool:
            for w, exc in pool.map(self._exec_one, self.workers.values()):
                if exc is not None:
                    w.state = TaskState.NOT_STARTED
                    self.monitor.on_terminal(w.task)
                    self._fail(
                        Failure(
                            "spawn",
                            f"cannot start worker_entry: {exc}",
                            time.time(),
                            w.task,
                            w.host,
                            attempt=self.attempt,
                        )
                    )
                else:
                    w.state = TaskState.STARTING
                    assert w.chan is not None
                    self.pump.add(w.task, w.chan)
        self.monitor = Monitor(list(self.workers), self.policy, self.clock())
        for w in self.workers.values():
            if w.state.is_terminal:
                self.monitor.on_terminal(w.task)

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> AttemptResult:
        self._start()
        next_ping = self.clock()
        next_status = self.clock()
        hello_deadline = self.clock() + self.policy.startup_timeout_s
        try:
            while True:
                try:
                    item = self.q.get(timeout=0.1)
                    self._handle(item)
                    # Drain what is already there before deciding anything (cheap, bounded).
                    for _ in range(256):
                        self._handle(self.q.get_nowait())
                except queue.Empty:
                    pass
                now = self.clock()
                self._check_interrupt()
                if self.state == JobState.STARTING:
                    self._maybe_go(now, hello_deadline)
                if now >= next_ping:
                    self._ping_all()
                    next_ping = now + self.policy.interval_s
                if self.state == JobState.RUNNING:  # while stopping, the teardown deadline rules
                    for v in self.monitor.check(now):
                        self._verdict(v)
                if self.teardown_deadline is not None:
                    if now >= self.teardown_deadline:
                        self._abandon_remaining()
                    else:
                        for task in self.monitor.silent_past_timeout(now):
                            self._abandon(self.workers[task], "silent past the heartbeat timeout during the teardown")
                self.logs.flush()
                if now >= next_status:
                    self._publish_status()
                    next_status = now + 1.0
                if all(w.state.is_terminal for w in self.workers.values()):
                    break
        finally:
            self.pump.stop()
            for w in self.workers.values():
                if w.chan is not None:
                    w.chan.close()
            self.logs.flush()
        return self._result()

    def _handle(self, item: tuple) -> None:
        _, key, out, err, eof = item
        w = self.workers[key]
        now = self.clock()
        if err:
            w.diag += err
            self._log(w, err if err.endswith(b"\n") else err + b"\n")
        if out:
            try:
                frames = w.decoder.feed(out)
            except wire.ProtocolError as exc:
                frames = []
                w.diag += f"protocol error: {exc}\n".encode()
            if w.decoder.preamble:
                noise = bytes(w.decoder.preamble)
                w.decoder.preamble.clear()
                self._log(w, noise if noise.endswith(b"\n") else noise + b"\n")
                if noise.strip():
                    self.bus.emit(
                        "shell_noise", task=w.task, host=w.host, text=noise.decode("utf-8", "replace").strip()
                    )
            for fr in frames:
                if fr.type == wire.T_LOG:
                    self._log(w, fr.payload)
                else:
                    self._message(w, fr.json(), now)
        if eof:
            self._on_eof(w)

    def _log(self, w: Worker, data: bytes) -> None:
        w.remember(data)
        self.logs.write(w.task, data)

    def _message(self, w: Worker, m: dict[str, Any], now: float) -> None:
        t = m.get("type")
        if w.state.is_alive:
            self.monitor.seen(w.task, now)
        if t == "heartbeat":
            w.last_hb = m
            w.last_hb_wall = time.time()
            self.monitor.on_heartbeat(w.task, m, now)
            self.heartbeats.write(w.task, {k: v for k, v in m.items() if k != "type"})
        elif t == "hello":
            w.facts = m.get("facts") or {}
            if w.sent_config_at is not None and "time" in w.facts:
                w.skew_s = w.facts["time"] - (w.sent_config_at + time.time()) / 2
            w.state = TaskState.READY
            self.bus.emit("task_ready", task=w.task, host=w.host, hostname=w.facts.get("hostname"), pid=m.get("pid"))
        elif t == "spawned":
            w.pid = m.get("pid")
            w.state = TaskState.STOPPING if w.stop_sent else TaskState.RUNNING
            self.bus.emit("task_spawned", task=w.task, host=w.host, pid=w.pid)
        elif t == "started":
            w.started_how = m.get("how")
            self.monitor.on_started(w.task, now)
            self.bus.emit("task_started", task=w.task, host=w.host, how=w.started_how)
        elif t == "strategy":
            self.monitor.on_started(w.task, now)
        elif t == "profile":
            w.profile = m
            self.heartbeats.write(w.task, {k: v for k, v in m.items() if k != "type"} | {"kind": "profile"})
            for v in self.monitor.on_profile(w.task, m, now):
                self._verdict(v)
        elif t == "exited":
            self._on_exited(w, m)

    def _on_exited(self, w: Worker, m: dict[str, Any]) -> None:
        if w.state.is_terminal:
            return
        w.exit = m
        code, sig = m.get("code"), m.get("signal")
        if m.get("not_started"):
            w.state = TaskState.NOT_STARTED
        elif code == 0:
            w.state = TaskState.SUCCEEDED
        elif w.stop_sent or (m.get("stopped") and self.stopping_reason):
            w.state = TaskState.STOPPED
        else:
            w.state = TaskState.FAILED
        self.monitor.on_terminal(w.task)
        self.bus.emit(
            "task_exited",
            task=w.task,
            host=w.host,
            code=code,
            signal=sig,
            signal_name=m.get("signal_name"),
            stopped=w.state == TaskState.STOPPED,
            reason=m.get("reason"),
        )
        if w.state == TaskState.FAILED:
            if sig:
                msg = f"killed by {m.get('signal_name') or sig}"
                kind = "signal"
            else:
                msg = m.get("error") or f"exited with code {code}"
                kind = "exit"
            self._blame_suspects(w)
            self._fail(
                Failure(
                    kind,
                    msg,
                    time.time(),
                    w.task,
                    w.host,
                    exit_code=code,
                    signal=m.get("signal_name"),
                    attempt=self.attempt,
                    last_lines=w.last_lines(),
                )
            )

    def _on_eof(self, w: Worker) -> None:
        if w.state.is_terminal:
            return
        status = w.chan.exit_status() if w.chan else None
        for _ in range(20):
            if status is not None:
                break
            time.sleep(0.01)
            status = w.chan.exit_status() if w.chan else None
        self.monitor.on_terminal(w.task)
        if self.stopping_reason and w.stop_sent:
            w.state = TaskState.STOPPED
            self.bus.emit(
                "task_exited",
                task=w.task,
                host=w.host,
                code=None,
                signal=None,
                stopped=True,
                reason="channel closed during teardown",
            )
            return
        w.state = TaskState.LOST
        diag = w.diag.decode("utf-8", "replace").strip()
        msg = f"connection closed without an exit status (channel status {status})"
        if status == 127 or "command not found" in diag or ("No such file" in diag and not w.decoder.synced):
            msg = f"cannot run {w.node.argv[0]!r} on the host (exit {status}): set job.python to the interpreter's path"
        elif "No module named worker_entry" in diag:
            msg = f"tfcluster is not installed for {w.node.argv[0]} on the host: pip install tfcluster there"
        self.bus.emit("task_lost", task=w.task, host=w.host, message=msg, status=status)
        self._blame_suspects(w)
        self._fail(
            Failure(
                "lost",
                msg,
                time.time(),
                w.task,
                w.host,
                exit_code=status,
                attempt=self.attempt,
                last_lines=w.last_lines(),
            )
        )

    # --- decisions ---------------------------------------------------------------------------

    def _maybe_go(self, now: float, hello_deadline: float) -> None:
        pending = [w for w in self.workers.values() if w.state == TaskState.STARTING]
        if pending and now < hello_deadline and not self.stopping_reason:
            return
        if self.stopping_reason:
            return
        if pending:
            names = ", ".join(w.task for w in pending)
            self._fail(
                Failure(
                    "startup_timeout",
                    f"worker_entry did not report within {self.policy.startup_timeout_s:g}s on {names}",
                    time.time(),
                    pending[0].task,
                    pending[0].host,
                    attempt=self.attempt,
                )
            )
            return
        ready = [w for w in self.workers.values() if w.state == TaskState.READY]
        facts = {w.task: w.facts or {} for w in ready}
        hosts = {w.task: w.host for w in ready}
        skews = {w.task: w.skew_s for w in ready if w.skew_s is not None}
        self.findings = evaluate(
            facts, hosts, legacy_keras=self.spec.tensorflow.legacy_keras, gpus=self.plan.nodes[0].gpus, skews=skews
        )
        blocking = [f for f in self.findings if f.blocks]
        warnings = [f for f in self.findings if not f.ok and not f.blocks]
        for f in self.findings:
            if f.check == "gpus" and not f.ok:
                self.bus.emit("heterogeneous_gpus", message=f.message)
        if self.preflight:
            self.bus.emit(
                "preflight",
                ok=not blocking,
                summary="; ".join(f"{f.task or 'all'}: {f.message}" for f in blocking + warnings),
                findings=[f.to_dict() for f in self.findings if not f.ok],
                warnings=len(warnings),
            )
            if blocking:
                first = blocking[0]
                msg = "; ".join(
                    f"{f.task or 'all'} ({f.host or '-'}): {f.message}" + (f" — fix: {f.fix}" if f.fix else "")
                    for f in blocking
                )
                self._fail(Failure("preflight", msg, time.time(), first.task, first.host, attempt=self.attempt))
                return
        if not ready:
            return
        for w in ready:
            self._send(w, {"op": "go"})
        self.went_at = now
        self.monitor.arm(now)
        self.state = JobState.RUNNING

    def _verdict(self, v: Verdict) -> None:
        event = {"lost": "worker_lost", "hung": "worker_hung", "stalled": "job_stalled"}.get(v.kind, v.kind)
        w = self.workers.get(v.task) if v.task else None
        self.bus.emit(event, task=v.task, host=w.host if w else None, message=v.message, **v.data)
        if v.kind == "lost" and w is not None and not v.data.get("suspect") and not w.state.is_terminal:
            # Silent past the timeout: waiting for its exit status would only delay the teardown.
            # Its worker_entry stops the task by itself when our pings stop reaching it.
            if w.chan is not None:
                w.chan.close()
            w.state = TaskState.LOST
            self.monitor.on_terminal(w.task)
        if v.fatal:
            self._fail(
                Failure(
                    v.kind,
                    v.message,
                    time.time(),
                    v.task,
                    w.host if w else None,
                    attempt=self.attempt,
                    last_lines=w.last_lines() if w else (),
                )
            )

    def _blame_suspects(self, failed: Worker) -> None:
        """A peer that went silent or was stopped *before* this failure is the likelier cause."""
        if self.failures:
            return
        for v in self.monitor.suspects(self.clock(), exclude=failed.task):
            self._verdict(v)

    def _fail(self, failure: Failure) -> None:
        self.failures.append(failure)
        if self.stopping_reason is None:
            where = f"{failure.task} ({failure.host})" if failure.task else "the job"
            self._teardown(f"{where}: {failure.message}", grace=self.spec.job.failure_grace_s)

    def _teardown(self, reason: str, grace: float | None = None, signum: int = signal.SIGTERM) -> None:
        grace = self.spec.job.stop_grace_s if grace is None else grace
        if self.stopping_reason is None:
            self.stopping_reason = reason
            self.state = JobState.STOPPING
            self.bus.emit("teardown", reason=reason, grace_s=grace)
        for w in self.workers.values():
            if w.state.is_alive and (not w.stop_sent or grace == 0):
                w.stop_sent = True
                if w.state in (TaskState.RUNNING, TaskState.READY, TaskState.STARTING):
                    w.state = TaskState.STOPPING
                self._send(w, {"op": "stop", "grace_s": grace, "reason": reason, "signal": int(signum)})
        deadline = self.clock() + grace + TEARDOWN_MARGIN_S
        self.teardown_deadline = min(self.teardown_deadline or deadline, deadline)

    def _abandon_remaining(self) -> None:
        """Past the teardown deadline: close the channels; worker_entry kills its group on EOF."""
        for w in self.workers.values():
            self._abandon(w, "no exit confirmation before the teardown deadline")
        self.teardown_deadline = None

    def _abandon(self, w: Worker, reason: str) -> None:
        """Stop waiting for one task's exit status (its node stops it when our channel or pings go)."""
        if w.state.is_terminal:
            return
        if w.chan is not None:
            w.chan.close()
        w.state = TaskState.LOST if not w.stop_sent else TaskState.STOPPED
        self.monitor.on_terminal(w.task)
        self.bus.emit("task_exited", task=w.task, host=w.host, code=None, signal=None, stopped=True, reason=reason)

    def _check_interrupt(self) -> None:
        if self.interrupt.count == self._handled_interrupts:
            return
        self._handled_interrupts = self.interrupt.count
        sig = self.interrupt.signum or signal.SIGINT
        name = signal.Signals(sig).name
        # Ctrl-C reaches the training processes as SIGINT (KeyboardInterrupt in Python, which TF's
        # own SIGTERM handler does not swallow); SIGTERM/SIGHUP as SIGTERM.
        forward = signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM
        if self.interrupted_by is None:
            self.interrupted_by = sig
            self.bus.emit("interrupted", signal=name)
            self._teardown(f"interrupted by {name}", signum=forward)
        else:
            self._teardown(f"interrupted again by {name}: killing now", grace=0, signum=forward)

    def _send(self, w: Worker, obj: dict[str, Any]) -> None:
        if w.chan is None or w.state.is_terminal:
            return
        try:
            w.chan.send(wire.command_line(obj))
        except OSError:
            pass  # the EOF will tell the rest

    def _ping_all(self) -> None:
        for w in self.workers.values():
            if w.state.is_alive:
                self._send(w, {"op": "ping"})

    # --- status and result -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now_wall = time.time()
        tasks = {}
        for w in self.workers.values():
            hb = w.last_hb
            prog = hb.get("progress") or {}
            tasks[w.task] = {
                "host": w.host,
                "hostname": (w.facts or {}).get("hostname"),
                "state": w.state.value,
                "pid": w.pid,
                "started": w.started_how is not None,
                "last_heartbeat_age_s": round(now_wall - w.last_hb_wall, 1) if w.last_hb_wall else None,
                "proc_state": hb.get("state"),
                "cpu_pct": hb.get("cpu_pct"),
                "rss_mb": hb.get("rss_mb"),
                "gpus": hb.get("gpus"),
                "steps": prog.get("steps"),
                "epoch": prog.get("epoch"),
                "step_time_s": prog.get("step_time_s"),
                "examples_per_s": prog.get("examples_per_s"),
                "exit_code": (w.exit or {}).get("code"),
                "signal": (w.exit or {}).get("signal_name"),
                "straggler": self.monitor.straggler == w.task,
            }
        return {
            "state": self.state.value,
            "attempt": self.attempt,
            "updated": now_wall,
            "stopping_reason": self.stopping_reason,
            "tasks": tasks,
        }

    def _publish_status(self) -> None:
        if self.on_status is not None:
            self.on_status(self.status())

    def _result(self) -> AttemptResult:
        tasks = {}
        for w in self.workers.values():
            e = w.exit or {}
            tasks[w.task] = TaskResult(
                task=w.task,
                host=w.host,
                state=w.state,
                exit_code=e.get("code"),
                signal=e.get("signal_name"),
                reason=e.get("reason"),
                started=w.started_how is not None,
            )
        if self.interrupted_by == signal.SIGTERM:
            state = JobState.INTERRUPTED_SIGTERM
        elif self.interrupted_by is not None:
            state = JobState.INTERRUPTED_SIGINT
        elif self.failures and self.failures[0].kind == "preflight":
            state = JobState.PREFLIGHT_FAILED
        elif self.failures or any(t.state != TaskState.SUCCEEDED for t in tasks.values()):
            state = JobState.FAILED
        else:
            state = JobState.SUCCEEDED
        self.state = state
        self._publish_status()
        return AttemptResult(
            attempt=self.attempt,
            state=state,
            started_ts=self.started_ts,
            ended_ts=time.time(),
            tasks=tasks,
            failures=list(self.failures),
        )
