"""The supervisor of one attempt: one decision loop over typed inputs — start, go, verdicts, teardown.

Inputs arrive on one queue: channels as the backend brings tasks up (``ChannelReady``) and bytes the
pump read (``Received``), which each task's ``TaskSession`` turns into typed messages. This loop owns
the attempt's state — its phase (``JobState``, through the one table), its failures, the go, each
task's current session — and is the only place that changes it, so decisions are simple and ordered.
Its collaborators each own one part and are told or asked explicitly: ``Monitor`` (verdicts),
``RoleCare`` (the role table: what a failure does, restarts in place, the training's end),
``Teardown`` and ``Interrupts`` (stop orders, the deadline, giving up on tasks), ``Snapshots``
(status). Nothing here waits on a task: a channel that closed before its exit status is known is
looked at again on later passes, until a deadline, and decided before anything that came after it.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from worker_entry import protocol as p

from ..backends import Backend, Channel, agent_crash, entry_failure
from ..core.result import AttemptResult, Failure
from ..core.states import JobState, TaskState, advance
from ..events import EventBus, HeartbeatSink, LogSink
from ..events import kinds as ev
from ..events.evaluations import Evaluations
from ..plan import Plan
from ..spec import ClusterSpec
from .bound import BoundWatch, RunBound
from .closed import EOF_POLL_S, ClosedChannels
from .figures import Figures
from .gate import GoGate
from .hints import hint_text
from .inputs import ChannelPump, ChannelReady, InputQueue, Interrupt, Received, read_horizon
from .monitor import Monitor
from .observe import Observations
from .pings import Pings, ping_period
from .reporting import Reporter
from .rolecare import RoleCare
from .session import PROTOCOL_HINT, Output, ShellNoise, TaskSession, Violation
from .status import Snapshots, attempt_result, status_period
from .teardown import Interrupts, StopOrder, Teardown
from .verdicts import VERDICT_EVENTS, Policy, Verdict

TICK_S = 0.1  # the scans of every task (go, verdicts, teardown, flush, status): at most this often
#: Inputs that can lead to a decision: a channel closed earlier is decided before them, as it came first.
_DECISIVE = (Violation, p.Hello, p.Profile, p.Exited)


class Supervisor:
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
        self.interrupt = interrupt
        self.on_status = on_status
        self.clock = clock
        self.policy = Policy.from_spec(spec, plan.policy)
        self.sessions = {str(n.task): TaskSession(n, attempt) for n in plan.nodes}  # each task's current one
        self.keys: dict[str, TaskSession] = dict(self.sessions)  # channel key -> session, restarted ones too
        self.q = InputQueue(clock=clock)  # bounded by items and bytes: a flood cannot grow the launcher
        self.pump = ChannelPump(self.q, clock)
        self.roles = RoleCare(spec, self.sessions, backend, self.pump, bus, attempt=attempt, deliver=self._deliver)
        self.monitor = Monitor(list(self.sessions), self.policy, clock(), self.roles.members())
        for s in self.sessions.values():
            s.on_terminal = self.monitor.on_terminal
        period = ping_period(self.policy.interval_s, plan.common.runtime.launcher_timeout_s)
        self.pings = Pings(list(self.sessions), period, clock())  # each task every `period`, round-robin
        self.teardown = Teardown(backend, bus, spec.job.stop_grace_s, clock)
        self.interrupts = Interrupts(interrupt)
        self.gate = GoGate(spec, plan, bus, self.roles.holding_go(), report=preflight, attempt=attempt)
        self.closed = ClosedChannels(clock)  # channels that ended before their task's end was known
        self.failures: list[Failure] = []
        self.state = JobState.STARTING
        self.went_at: float | None = None
        self.started_ts = time.time()
        self.bound = BoundWatch(bound, spec.job.startup_timeout_s) if bound is not None and bound.active else None
        self.bound_reached: str | None = None
        # the tasks' figures: the job's (across attempts) when it passes them, fed every record we write
        self.figures = figures if figures is not None else Figures()
        self.snapshots = Snapshots(self.sessions, self.figures, evaluations)
        self.reporter = Reporter(self.snapshots, self.monitor, backend, bus, attempt=attempt)
        self.observed = Observations(self.monitor, bus, heartbeats, self.figures, self.snapshots, attempt=attempt)
        self._settle = False  # a task became ready or terminal since the loop last looked

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
        next_status = next_tick = self.clock()
        try:
            while True:
                try:
                    self._handle(self.q.get(timeout=EOF_POLL_S if self.closed else TICK_S))
                    for item in self.q.get_many(256):  # what is already there, before deciding anything
                        self._handle(item)
                except queue.Empty:
                    pass
                now = self.clock()
                if self.closed:
                    self._settle_closed(now)
                    if self.closed:
                        continue  # nothing is decided while a closed channel's exit status is awaited
                if (order := self.interrupts.order()) is not None:
                    self._stop(order)
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
                self.pings.tick(now, self.sessions)
                heard = self._heard(now)  # silence is judged up to what the launcher has read, not to now
                if self.state == JobState.RUNNING:  # while stopping, the teardown deadline rules
                    for v in self.monitor.check(heard):
                        self._verdict(v)
                    self._check_bound(now)
                for task in self.teardown.give_up(now, self.sessions, self._silent):
                    self.snapshots.touch(task)
                self.logs.flush()
                if now >= next_status:
                    self.reporter.publish(self.on_status, self.state, self.teardown.reason)
                    next_status = now + status_period(len(self.sessions))
                if all(s.state.is_terminal for s in self.sessions.values()):
                    break
        finally:
            self.pump.stop()
            self.pump.join(2)
            for item in self.pump.leftovers():  # late lines, a task_files in flight
                self._handle(item)
            self._settle_closed()
            for s in self.sessions.values():
                if not s.handing_over:
                    s.close()
            for s in self.keys.values():
                if self._retired(s):  # replaced by a restart in place: nothing of it is handed over
                    s.abandoned = True
                    s.close()
            self.logs.flush()
        return self._result()

    def _heard(self, now: float) -> float:
        """Up to when every node's bytes were read and handled (``inputs.read_horizon``)."""
        return read_horizon(now, self.pump, self.q, 3 * self.policy.timeout_s)

    def _silent(self, now: float) -> list[str]:
        return self.monitor.silent_past_timeout(self._heard(now))

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
            self._settle_closed()
            self._on_channel(s, item)
            return
        retired = self._retired(s)
        # given up on with no exit heard: what it sent before, read late (a lagging loop, the leftovers), is moot
        moot = retired or (s.state.is_terminal and s.exit is None and s.violation is None)
        items = s.receive(item.out, item.err)
        if self.closed and (item.eof or any(isinstance(x, _DECISIVE) for x in items)):
            self._settle_closed()
        for x in items:
            if isinstance(x, Output):
                self.logs.write(s.task, x.data)
            elif moot:
                continue  # a replaced incarnation, or one given up on: only its last lines matter
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
            self._fail(s.failure("spawn", f"cannot start worker_entry: {item.error}", last_lines=()))
            return
        if s.state.is_terminal:  # abandoned while it was starting
            item.channel.close()
            return
        s.attach(item.channel)
        self.pump.add(s.key, item.channel)
        if self.teardown.reason is not None:  # the job is already being torn down: stop it before the go
            s.stop_sent = True
            s.send(p.Stop(grace_s=0, reason=self.teardown.reason))

    def _message(self, s: TaskSession, m: p.Message) -> None:
        for v in self.observed.message(s, m, self.clock()):
            self._verdict(v)
        late = isinstance(m, p.Hello) and self.went_at is not None and self.teardown.reason is None
        if isinstance(m, p.Exited):
            self._on_exited(s, m)
        elif late and s.state == TaskState.READY:  # said hello after the go (a sidecar evaluator, a restart)
            s.send(p.Go())

    def _on_exited(self, s: TaskSession, m: p.Exited) -> None:
        state = s.finish(m, job_stopping=self.teardown.reason is not None, failing=bool(self.failures))
        stopped = state == TaskState.STOPPED
        exited = {"code": m.code, "signal": m.signal, "signal_name": m.signal_name, "reason": m.reason}
        self.bus.emit(ev.TaskExited(task=s.task, host=s.host, stopped=stopped, **exited))
        if state == TaskState.SUCCEEDED:
            end = self.roles.training_end(self.sessions, stopping=self.teardown.reason is not None)
            if end is not None:
                self._stop(end)
        if state != TaskState.FAILED:
            return
        if m.signal:
            kind, msg = "signal", f"killed by {m.signal_name or m.signal}"
        else:
            kind, msg = "exit", m.error or f"exited with code {m.code}"
        self._blame_suspects(s)
        hint = hint_text(s.hint) if s.hint is not None else ""  # a known mistake of the script: its fix
        self._fail(s.failure(kind, msg, exit_code=m.code, signal=m.signal_name, hint=hint))

    def _on_eof(self, s: TaskSession) -> None:
        """Nothing more comes on this channel: decided by ``_settle_closed``, at once or on a later pass."""
        s.abandoned = True
        if not s.state.is_terminal:
            self.closed.add(s)
            self._settle_closed(self.clock())

    def _settle_closed(self, now: float | None = None) -> None:
        """Decide the tasks whose channel closed without an exit (``closed``: in order, each once its
        status came or it waited long enough; every one when ``now`` is None): one told to stop has
        stopped, any other is lost."""
        for s, stopped, status in self.closed.due(lambda s: bool(self.teardown.reason and s.stop_sent), now):
            self._settle = True
            self.snapshots.touch(s.task)
            if s.state.is_terminal:
                continue
            if stopped:
                s.become(TaskState.STOPPED)
                self.teardown.stopped_waiting(s, "channel closed during teardown")
            else:
                self._lost(s, status)

    def _lost(self, s: TaskSession, status: int | None) -> None:
        s.become(TaskState.LOST)
        crash = agent_crash(status, s.diag_text)
        diag = crash or entry_failure(status, s.diag_text, s.node.argv[0], synced=s.decoder.synced)
        msg = diag.message if diag else f"connection closed without an exit status (channel status {status})"
        self.bus.emit(ev.TaskLost(task=s.task, host=s.host, message=msg, status=status))
        self._blame_suspects(s)
        kind = "agent" if crash else "lost"  # a reachable host whose agent raised is not a lost host
        self._fail(s.failure(kind, msg, exit_code=status, hint=diag.hint if diag else ""))

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
        self._fail(s.failure("protocol", msg, hint=PROTOCOL_HINT))

    # --- decisions ---------------------------------------------------------------------------

    def _maybe_go(self, now: float, hello_deadline: float) -> None:
        if self.teardown.reason:
            return
        go = self.gate.decide(now, hello_deadline, self.sessions)
        if isinstance(go, Failure):
            self._fail(go)
        elif go:
            for s in go:
                s.send(p.Go())
            self.went_at = now
            self.monitor.arm(self.clock())  # after the last go went out: thousands of them take a while
            self.state = advance(self.state, JobState.RUNNING)

    def _verdict(self, v: Verdict) -> None:
        self._settle_closed()
        s = self.sessions.get(v.task) if v.task else None
        self.snapshots.touch(v.task)
        self.bus.emit(VERDICT_EVENTS[v.kind](task=v.task, host=s.host if s else None, message=v.message, **v.data))
        if v.kind == "lost" and s is not None and not v.data.get("suspect") and not s.state.is_terminal:
            # Silent past the timeout: waiting for its exit status would only delay the teardown.
            # Its worker_entry stops the task by itself when our pings stop reaching it.
            s.close()
            s.become(TaskState.LOST)
        if v.fatal:
            self._fail(
                s.failure(v.kind, v.message) if s else Failure(v.kind, v.message, time.time(), attempt=self.attempt)
            )

    def _check_bound(self, now: float) -> None:
        """A bounded run that had enough stops like `tfcluster stop`, and counts as a success."""
        if self.bound is None or self.teardown.reason:
            return
        rules, live = self.roles.rules, self.figures.live
        running = {
            t: live(t).steps for t, s in self.sessions.items() if s.state == TaskState.RUNNING and rules[t].collective
        }  # (a ps or an evaluator has no steps)
        examples = {t: self.figures.examples(t) for t in running}
        if (why := self.bound.check(running, now, self.went_at, examples)) is not None:
            self.bound_reached = why
            done = ev.BoundReached(message=why, steps=min((n or 0 for n in running.values()), default=0))
            self._stop(StopOrder(f"bounded run: {why}", bounded=True, announce=done))

    def _blame_suspects(self, failed_task: TaskSession) -> None:
        """A peer that went silent or was stopped *before* this failure is the likelier cause."""
        if self.failures or self.roles.rules[failed_task.task].on_failure != "teardown":
            return
        for v in self.monitor.suspects(self._heard(self.clock()), exclude=failed_task.task):
            self._verdict(v)

    def _fail(self, failure: Failure) -> None:
        """A failure: its role decides (``RoleCare.judge``) whether the job fails with it — the first is
        the root cause, the tasks are stopped — or its task is restarted in place, or only reported."""
        self._settle_closed()
        decision = self.roles.judge(failure, stopping=self.teardown.reason is not None, went=self.went_at is not None)
        if decision.action != "teardown":
            s = self.sessions[str(failure.task)]
            self.roles.absorb(s, decision)
            if decision.action == "restart":
                self._restart(s, decision.restarts)
            self.snapshots.touch(s.task)
            return
        failure = decision.failure
        self.failures.append(failure)
        if self.teardown.reason is None:
            where = f"{failure.task} ({failure.host})" if failure.task else "the job"
            self._stop(StopOrder(f"{where}: {failure.message}", grace=self.spec.job.failure_grace_s))

    def _restart(self, old: TaskSession, n: int) -> None:
        """The task's next incarnation replaces it here; it gets the go as soon as it says hello."""
        new, error = self.roles.restart(old, n, self.sessions.values())
        new.on_terminal = self.monitor.on_terminal
        self.sessions[old.task] = new
        self.keys[new.key] = new
        self.monitor.revive(old.task, self.clock())
        if error is not None:  # no retry can mend it: the job fails now, saying why
            new.become(TaskState.NOT_STARTED)
            self._fail(new.failure("restart", error, last_lines=()))

    def _retired(self, s: TaskSession) -> bool:
        """An incarnation replaced by a restart: what it still sends is only logged."""
        return self.sessions.get(s.task) is not s

    def _stop(self, order: StopOrder) -> None:
        """Carry out a stop order: its cause announced, the attempt stopping, every live task told."""
        self._settle_closed()
        if order.announce is not None:
            self.bus.emit(order.announce)
        self.snapshots.touch()
        if self.teardown.reason is None:
            self.state = advance(self.state, JobState.STOPPING)
        self.teardown.stop(order, self.sessions.values())

    # --- status and result -------------------------------------------------------------------

    def _result(self) -> AttemptResult:
        result = attempt_result(
            self.sessions.values(),
            attempt=self.attempt,
            failures=self.failures,
            interrupted_by=self.interrupts.by,
            started_ts=self.started_ts,
            went=self.went_at is not None,
            bounded=self.bound_reached is not None or self.roles.training_ended,
            optional=self.roles.optional(),
        )
        self.state = advance(self.state, result.state)
        self.reporter.publish(self.on_status, self.state, self.teardown.reason, final=True)
        return result
