"""What a node's messages tell the launcher — the monitor's observations, the events they become, the
records — for the decision loop, which decides on what this returns (the monitor's verdicts).

A heartbeat and a step-clock window are written to heartbeats.jsonl and the very same record to the
figures (``report`` reads the file: same records, same figures); a hello, a spawn, a start and an
evaluator's metrics become events; every message from a live task tells the monitor it was heard.
"""

from __future__ import annotations

from typing import Any

from worker_entry import protocol as p

from ..events import EventBus, HeartbeatSink
from ..events import kinds as ev
from .clock import on_launcher_clock
from .figures import Figures
from .hints import hint_text
from .monitor import Monitor
from .session import TaskSession, record_of
from .status import Snapshots
from .verdicts import Verdict

_EVALUATION = ("count", "metrics", "step", "checkpoint", "source", "dropped")


class Observations:
    def __init__(
        self,
        monitor: Monitor,
        bus: EventBus,
        heartbeats: HeartbeatSink,
        figures: Figures,
        snapshots: Snapshots,
        *,
        attempt: int,
    ) -> None:
        self.monitor = monitor
        self.bus = bus
        self.heartbeats = heartbeats
        self.figures = figures
        self.snapshots = snapshots
        self.attempt = attempt
        self.hinted: set[str] = set()  # the codes of the script's mistakes told so far (supervise.hints)

    def message(self, s: TaskSession, m: p.Message, now: float) -> list[Verdict]:
        """Take in one message of ``s`` (validated, in order: its session accepted it); the verdicts it
        leads to (a round of step-clock windows judged). An ``exited`` is only heard here: its meaning is
        the loop's."""
        if isinstance(m, p.Heartbeat):  # (``on_heartbeat`` marks it seen: not a second time here)
            record = {**record_of(m), "attempt": self.attempt}
            self.monitor.on_heartbeat(s.task, m, now, record)
            self._record(s.task, on_launcher_clock(record, s))
            return []
        if s.state.is_alive:
            self.monitor.seen(s.task, now)
        if isinstance(m, p.Hello):
            facts = m.facts
            gpus = [{"name": g.name, "memory_mb": g.memory_mb} for g in facts.gpus]
            self.monitor.gpus.on_models(s.task, [{"index": g.index, "name": g.name} for g in facts.gpus])
            self.bus.emit(
                ev.TaskReady(
                    task=s.task,
                    host=s.host,
                    hostname=facts.hostname,
                    pid=m.pid,
                    gpus=gpus,
                    cpus=facts.cpus,
                    machine=facts.boot_id,
                )
            )
        elif isinstance(m, p.Spawned):
            self.bus.emit(ev.TaskSpawned(task=s.task, host=s.host, pid=m.pid))
        elif isinstance(m, p.Started):
            self.monitor.on_started(s.task, now)
            self.bus.emit(ev.TaskStarted(task=s.task, host=s.host, how=m.how))
        elif isinstance(m, p.StrategyInfo):
            self.monitor.on_started(s.task, now)
        elif isinstance(m, p.Profile):
            record = record_of(m)
            self._record(s.task, on_launcher_clock({**record, "kind": "profile", "attempt": self.attempt}, s))
            return self.monitor.on_profile(s.task, record, now)
        elif isinstance(m, p.Hint) and m.code not in self.hinted:  # every worker makes the same mistake: once
            self.hinted.add(m.code)
            where = {"file": m.file or None, "line": m.line}
            self.bus.emit(ev.ScriptHint(task=s.task, host=s.host, code=m.code, message=hint_text(m), **where))
        elif isinstance(m, p.Evaluation):  # an evaluator's metrics: an event, folded into its status entry
            fields = {k: getattr(m, k) for k in _EVALUATION}
            self.snapshots.evaluated(self.bus.emit(ev.Evaluation(task=s.task, host=s.host, **fields)))
        return []

    def _record(self, task: str, record: dict[str, Any]) -> None:
        self.heartbeats.write(task, record)
        self.figures.add(task, record)
