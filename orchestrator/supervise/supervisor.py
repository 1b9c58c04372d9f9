"""The supervisor of one attempt: one decision loop over typed inputs — start, go, verdicts, teardown.

Inputs arrive on one queue: channels as the backend brings tasks up (``ChannelReady``) and bytes the
pump read (``Received``), which each task's ``TaskSession`` turns into typed messages. This loop is
the only place that changes the job's state, so decisions are simple and ordered. Policy lives in
``monitor``, cross-host rules in ``checks``, reporting in ``status``; here is the wiring.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from worker_entry import protocol as p

from ..backends import Backend, Channel, entry_failure
from ..core.result import AttemptResult, Failure
from ..core.states import JobState, TaskState
from ..events import EventBus, HeartbeatSink, LogSink
from ..events import kinds as ev
from ..events.evaluations import Evaluations
from ..plan import Plan
from ..spec import ClusterSpec
from .bound import BoundWatch, RunBound
from .figures import Figures
from .gate import check_before_go
from .inputs import QUEUE_ITEMS, ChannelPump, ChannelReady, Interrupt, Received
from .monitor import Monitor
from .rolecare import RoleCare
from .session import PROTOCOL_HINT, Output, ShellNoise, TaskSession, Violation, record_of
from .status import Snapshots, attempt_result, status_period
from .teardown import Teardown
from .verdicts import VERDICT_EVENTS, Policy, Verdict

TICK_S = 0.1  # the scans of every task (go, verdicts, teardown, flush, status): at most this often
_NOT_UP = (TaskState.PENDING, TaskState.STARTING)


class Supervisor(Teardown, RoleCare):
    def __init__(
        self,
        spec: ClusterSpec,
        plan: Plan,
        backend: Backend,
        *,
        attempt: int,
        bus: EventBus,
        logs: LogSink,
        heartbeats: HeartbeatSink,
        interrupt: Interrupt,
        preflight: bool = True,
        on_status: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        bound: RunBound | None = None,
        figures: Figures | None = None,
        evaluations: Evaluations | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.backend = backend
        self.attempt = attempt
        self.bus = bus
        self.logs = logs
        self.heartbeats = heartbeats
        self.interrupt = interrupt
        self.preflight = preflight
        self.on_status = on_status
        self.clock = clock
        self.policy = Policy.from_spec(spec, plan.policy)
        self.sessions = {str(n.task): TaskSession(n, attempt) for n in plan.nodes}
        self._init_roles()  # each task's role rule (plan.roles), restarts in place
        self.monitor = Monitor(list(self.sessions), self.policy, clock(), self._members())
        for s in self.sessions.values():
            s.on_terminal = self.monitor.on_terminal
        self.q: queue.Queue = queue.Queue(maxsize=QUEUE_ITEMS)
        self._settle = False  # a task became ready or terminal since the loop last looked
        self.pump = ChannelPump(self.q)
        self.failures: list[Failure] = []
        self.state = JobState.STARTING
        self.stopping_reason: str | None = None
        self.teardown_deadline: float | None = None
        self.interrupted_by: int | None = None
        self.went_at: float | None = None
        self.started_ts = time.time()
        self._handled_interrupts = 0
        self.bound = BoundWatch(bound, spec.job.startup_timeout_s) if bound is not None and bound.active else None
        self.bound_reached: str | None = None
        # the tasks' figures: the job's (across attempts) when it passes them, fed every record we write
        self.figures = figures if figures is not None else Figures()
        self.snapshots = Snapshots(self.sessions, self.figures, evaluations)

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> AttemptResult:
        """One attempt, owned from its start to its end: start every task, decide (go, verdicts, teardown)
        on every input until each task is terminal, and return the attempt's result — failures as data,
        the first one its root cause. Channels of tasks that ended cleanly stay open for the hand-over."""
        self.pump.start()
        self.bus.emit(ev.AttemptStarted(attempt=self.attempt))
        starts = [(n, n.node_config(self.attempt)) for n in self.plan.nodes]
        self.backend.start_all(starts, self._deliver)
        hello_deadline = self.clock() + self.policy.startup_timeout_s
        next_ping = next_status = next_tick = self.clock()
        try:
            while True:
                try:
                    self._handle(self.q.get(timeout=TICK_S))
                    for _ in range(256):  # what is already there, before deciding anything
                        self._handle(self.q.get_nowait())
                except queue.Empty:
                    pass
                now = self.clock()
                self._check_interrupt()
                if self._settle:  # a task came up or ended (once per batch of inputs, not per task)
                    self._settle = False
                    if self.state == JobState.STARTING:
                        self._maybe_go(now, hello_deadline)
                    if all(s.state.is_terminal for s in self.sessions.values()):
                        break
                if now < next_tick:
                    continue  # inputs decide at once (an exit, a violation); the scans of every task below
                next_tick = now + TICK_S  # run at most every TICK_S, however fast the inputs come
                if self.state == JobState.STARTING:
                    self._maybe_go(now, hello_deadline)
                if now >= next_ping:
                    self._broadcast(p.Ping())
                    next_ping = now + self.policy.interval_s
                if self.state == JobState.RUNNING:  # while stopping, the teardown deadline rules
                    for v in self.monitor.check(now):
                        self._verdict(v)
                    self._check_bound(now)
                if self.teardown_deadline is not None:
                    if now >= self.teardown_deadline:
                        self._abandon_all("no exit confirmation before the teardown deadline")
                    else:
                        for task in self.monitor.silent_past_timeout(now):
                            self._abandon(self.sessions[task], "silent past the heartbeat timeout during the teardown")
                self.logs.flush()
                if now >= next_status:
                    self._publish_status()
                    next_status = now + status_period(len(self.sessions))
                if all(s.state.is_terminal for s in self.sessions.values()):
                    break
        finally:
            self.pump.stop()
            self.pump.join(2)
            self._drain()
            for s in self.sessions.values():
                if not s.handing_over:
                    s.close()
            for s in self.keys.values():
                if self._retired(s):  # replaced by a restart in place: nothing of it is handed over
                    s.abandoned = True
                    s.close()
            self.logs.flush()
        return self._result()

    def _drain(self) -> None:
        """Decode what the pump read before it stopped (late lines, a task_files in flight)."""
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                if not self.pump.spill:
                    return
                item = self.pump.spill.pop(0)
            if isinstance(item, ChannelReady):
                if item.channel is not None:
                    item.channel.close()
                continue
            self._handle(item)

    def _deliver(self, task: str, chan: Channel | BaseException) -> None:
        """Called from the backend's threads: a task's channel (or why there is none)."""
        self.q.put(ChannelReady(task, chan, None) if isinstance(chan, Channel) else ChannelReady(task, None, chan))

    def _handle(self, item: ChannelReady | Received) -> None:
        s = self.keys[item.task]  # (item.task: the channel's key, TASK#N after a restart in place)
        before = s.state
        try:
            self._handle_item(s, item)
        finally:
            if s.state is not before and (s.state == TaskState.READY or s.state.is_terminal):
                self._settle = True  # the go and the attempt's end are decided at once, not at the next tick

    def _handle_item(self, s: TaskSession, item: ChannelReady | Received) -> None:
        self.snapshots.touch(s.task)  # (its status entry is rebuilt at the next snapshot)
        if isinstance(item, ChannelReady):
            self._on_channel(s, item)
            return
        retired = self._retired(s)
        for x in s.receive(item.out, item.err):
            if isinstance(x, Output):
                self.logs.write(s.task, x.data)
            elif retired:
                continue  # a replaced incarnation: only its last lines matter
            elif isinstance(x, ShellNoise):
                self.bus.emit(ev.ShellNoise(task=s.task, host=s.host, text=x.text))
            elif isinstance(x, Violation):
                self._on_violation(s, x.error)
            else:
                self._message(s, x)
        if item.eof and not retired:
            self._on_eof(s)

    def _on_channel(self, s: TaskSession, item: ChannelReady) -> None:
        if item.channel is None:
            if s.channel is not None or s.state.is_terminal:
                return  # it is up already (or given up on): a late error of the launcher is moot
            s.become(TaskState.NOT_STARTED)
            self._fail(self._failure("spawn", f"cannot start worker_entry: {item.error}", s, last_lines=()))
            return
        if s.state.is_terminal:  # abandoned while it was starting
            item.channel.close()
            return
        s.attach(item.channel)
        self.pump.add(s.key, item.channel)
        if self.stopping_reason is not None:  # the job is already being torn down: stop it before the go
            s.stop_sent = True
            s.send(p.Stop(grace_s=0, reason=self.stopping_reason))

    def _message(self, s: TaskSession, m: p.Message) -> None:
        now = self.clock()
        if s.state.is_alive:
            self.monitor.seen(s.task, now)
        if isinstance(m, p.Heartbeat):
            self.monitor.on_heartbeat(s.task, m, now)
            self._record(s.task, {**record_of(m), "attempt": self.attempt})
        elif isinstance(m, p.Hello):
            hostname = m.facts.hostname
            gpus = [{"name": g.name, "memory_mb": g.memory_mb} for g in m.facts.gpus]
            self.monitor.gpus.on_models(s.task, [{"index": g.index, "name": g.name} for g in m.facts.gpus])
            self.bus.emit(ev.TaskReady(task=s.task, host=s.host, hostname=hostname, pid=m.pid, gpus=gpus))
            self._late_go(s)
        elif isinstance(m, p.Spawned):
            self.bus.emit(ev.TaskSpawned(task=s.task, host=s.host, pid=m.pid))
        elif isinstance(m, p.Started):
            self.monitor.on_started(s.task, now)
            self.bus.emit(ev.TaskStarted(task=s.task, host=s.host, how=m.how))
        elif isinstance(m, p.StrategyInfo):
            self.monitor.on_started(s.task, now)
        elif isinstance(m, p.Profile):
            record = record_of(m)
            self._record(s.task, {**record, "kind": "profile", "attempt": self.attempt})
            for v in self.monitor.on_profile(s.task, record, now):
                self._verdict(v)
        elif isinstance(m, p.Evaluation):  # an evaluator's metrics: an event, folded into its status entry
            self.snapshots.evaluated(
                self.bus.emit(
                    ev.Evaluation(
                        task=s.task,
                        host=s.host,
                        count=m.count,
                        metrics=m.metrics,
                        step=m.step,
                        checkpoint=m.checkpoint,
                        source=m.source,
                        dropped=m.dropped,
                    )
                )
            )
        elif isinstance(m, p.Exited):
            self._on_exited(s, m)

    def _record(self, task: str, record: dict[str, Any]) -> None:
        """Written to heartbeats.jsonl, and the very same record to the figures (`report` reads the file)."""
        self.heartbeats.write(task, record)
        self.figures.add(task, record)

    def _on_exited(self, s: TaskSession, m: p.Exited) -> None:
        state = s.finish(m, job_stopping=self.stopping_reason is not None)
        self.bus.emit(
            ev.TaskExited(
                task=s.task,
                host=s.host,
                code=m.code,
                signal=m.signal,
                signal_name=m.signal_name,
                stopped=state == TaskState.STOPPED,
                reason=m.reason,
            )
        )
        if state == TaskState.SUCCEEDED:
            self._check_training_end()
        if state != TaskState.FAILED:
            return
        if m.signal:
            kind, msg = "signal", f"killed by {m.signal_name or m.signal}"
        else:
            kind, msg = "exit", m.error or f"exited with code {m.code}"
        self._blame_suspects(s)
        self._fail(self._failure(kind, msg, s, exit_code=m.code, signal=m.signal_name))

    def _on_eof(self, s: TaskSession) -> None:
        s.abandoned = True  # nothing more will come on this channel
        if s.state.is_terminal:
            return
        status = s.channel.exit_status() if s.channel else None
        for _ in range(20):
            if status is not None:
                break
            time.sleep(0.01)
            status = s.channel.exit_status() if s.channel else None
        if self.stopping_reason and s.stop_sent:
            s.become(TaskState.STOPPED)
            self._stopped_waiting(s, "channel closed during teardown")
            return
        s.become(TaskState.LOST)
        diag = entry_failure(status, s.diag_text, s.node.argv[0], synced=s.decoder.synced)
        msg = diag.message if diag else f"connection closed without an exit status (channel status {status})"
        self.bus.emit(ev.TaskLost(task=s.task, host=s.host, message=msg, status=status))
        self._blame_suspects(s)
        self._fail(self._failure("lost", msg, s, exit_code=status, hint=diag.hint if diag else ""))

    def _on_violation(self, s: TaskSession, error: str) -> None:
        """The node broke the protocol: that task fails (its node stops it when its channel closes)."""
        msg = f"protocol error from {s.host}: {error}"
        self.bus.emit(ev.NodeProtocolError(task=s.task, host=s.host, message=msg))
        was_alive = s.state.is_alive
        s.send(p.Stop(grace_s=0, reason=msg))
        s.stop_sent = True
        self.pump.remove(s.key)
        s.close()
        if was_alive:
            s.become(TaskState.FAILED)
        self._fail(self._failure("protocol", msg, s, hint=PROTOCOL_HINT))

    # --- decisions ---------------------------------------------------------------------------

    def _maybe_go(self, now: float, hello_deadline: float) -> None:
        if self.stopping_reason:
            return
        # the go waits for the tasks whose role holds it (not a sidecar evaluator: it gets its go when it is up)
        if now < hello_deadline and any(
            s.state in _NOT_UP and self.rules[t].holds_go for t, s in self.sessions.items()
        ):
            return  # stops at the first task not up yet: no scan of every task per tick while they come
        waiting = [s for t, s in self.sessions.items() if s.state in _NOT_UP and self.rules[t].holds_go]
        if waiting:
            names = ", ".join(s.task for s in waiting)
            msg = f"worker_entry did not report within {self.policy.startup_timeout_s:g}s on {names}"
            self._fail(self._failure("startup_timeout", msg, waiting[0], last_lines=()))
            return
        ready = [s for s in self.sessions.values() if s.state == TaskState.READY]
        failure = check_before_go(ready, self.spec, self.plan, self.bus, report=self.preflight, attempt=self.attempt)
        if failure is not None:
            self._fail(failure)
            return
        if not ready:
            return
        for s in ready:
            s.send(p.Go())
        self.went_at = now
        self.monitor.arm(now)
        self.state = JobState.RUNNING

    def _verdict(self, v: Verdict) -> None:
        s = self.sessions.get(v.task) if v.task else None
        self.snapshots.touch(v.task)
        self.bus.emit(VERDICT_EVENTS[v.kind](task=v.task, host=s.host if s else None, message=v.message, **v.data))
        if v.kind == "lost" and s is not None and not v.data.get("suspect") and not s.state.is_terminal:
            # Silent past the timeout: waiting for its exit status would only delay the teardown.
            # Its worker_entry stops the task by itself when our pings stop reaching it.
            s.close()
            s.become(TaskState.LOST)
        if v.fatal:
            self._fail(self._failure(v.kind, v.message, s))

    def _check_bound(self, now: float) -> None:
        """A bounded run that had enough stops like `tfcluster stop`, and counts as a success."""
        if self.bound is None or self.stopping_reason:
            return
        running = {
            t: self.figures.live(t).steps
            for t, s in self.sessions.items()
            if s.state == TaskState.RUNNING and self.rules[t].collective
        }  # (a ps or an evaluator has no steps)
        examples = {t: self.figures.examples(t) for t in running}
        if (why := self.bound.check(running, now, self.went_at, examples)) is not None:
            self.bound_reached = why
            self.bus.emit(ev.BoundReached(message=why, steps=min((n or 0 for n in running.values()), default=0)))
            self._teardown(f"bounded run: {why}", bounded=True)

    def _blame_suspects(self, failed_task: TaskSession) -> None:
        """A peer that went silent or was stopped *before* this failure is the likelier cause."""
        if self.failures or self.rules[failed_task.task].on_failure != "teardown":
            return
        for v in self.monitor.suspects(self.clock(), exclude=failed_task.task):
            self._verdict(v)

    def _failure(self, kind: str, message: str, s: TaskSession | None, **fields: Any) -> Failure:
        """A failure of this attempt, attributed to ``s`` (with its last output lines) when given."""
        if s is not None:
            fields.setdefault("last_lines", s.last_lines())
        task, host = (s.task, s.host) if s is not None else (None, None)
        return Failure(kind, message, time.time(), task, host, attempt=self.attempt, **fields)

    def _fail(self, failure: Failure) -> None:
        if (fatal := self._tolerate(failure)) is None:
            return  # its role does not take the job down: restarted in place, or reported
        failure = fatal
        self.failures.append(failure)
        if self.stopping_reason is None:
            where = f"{failure.task} ({failure.host})" if failure.task else "the job"
            self._teardown(f"{where}: {failure.message}", grace=self.spec.job.failure_grace_s)

    def _broadcast(self, command: p.Message) -> None:
        for s in self.sessions.values():
            if s.state.is_alive:
                s.send(command)

    # --- status and result -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        status = self.snapshots.build(
            state=self.state,
            attempt=self.attempt,
            stopping_reason=self.stopping_reason,
            straggler=self.monitor.straggler,
            gpu_problems=self.monitor.gpus.judgement.by_task(),
            scores=self.monitor.scores,
        )
        if (refusals := self.backend.refusals()) is not None:
            status["refused_connections"] = refusals.summary()
        return status

    def _publish_status(self, final: bool = False) -> None:
        refusals = self.backend.refusals()
        if refusals is not None and (r := refusals.report(final=final)) is not None:  # rate-limited, not at the end
            self.bus.emit(ev.ConnectionRefused(peer=r.peer, reason=r.reason, count=r.count, total=r.total))
        if self.on_status is not None:
            self.on_status(self.status())

    def _result(self) -> AttemptResult:
        result = attempt_result(
            self.sessions.values(),
            attempt=self.attempt,
            failures=self.failures,
            interrupted_by=self.interrupted_by,
            started_ts=self.started_ts,
            went=self.went_at is not None,
            bounded=self.bound_reached is not None or self.training_ended,
            optional={t for t, r in self.rules.items() if not r.trains},
        )
        self.state = result.state
        self._publish_status(final=True)
        return result
