"""The supervisor's unit tier harness: a recorder of everything the supervisor emits, and ``supervise``,
which runs one attempt over in-process fake nodes (tests/fakenode.py: the real protocol, no sshd)."""

from __future__ import annotations

import dataclasses
import json

from fakenode import FakeBackend, FakeClock, make_plan

from orchestrator.core.states import JobState
from orchestrator.events import EventBus
from orchestrator.supervise import Interrupt, Supervisor


class Recorder:
    """Event sink + log sink + heartbeat sink in one, keeping everything in order."""

    def __init__(self) -> None:
        self.events: list = []
        self.lines: dict[str, bytes] = {}
        self.beats: list = []

    def handle(self, ev) -> None:
        """Every event the supervisor emits must read back from its events.jsonl line as it was."""
        line = json.loads(json.dumps(ev.to_dict()))
        assert type(ev).from_dict(line) == dataclasses.replace(ev, ts=round(ev.ts, 3)), line
        self.events.append(ev)

    def close(self) -> None:
        pass

    def write(self, task, data, ts=None) -> None:
        if isinstance(data, dict):
            self.beats.append((task, data))
        else:
            self.lines[task] = self.lines.get(task, b"") + data

    def flush(self) -> None:
        pass

    def kinds(self, kind: str) -> list:
        return [e for e in self.events if e.event == kind]


def build_supervisor(loaded, plan, backend, rec, interrupt=None, bound=None) -> Supervisor:
    """The real supervisor of attempt 0 over ``backend``'s fake nodes, on its clock; every sink ``rec``."""
    return Supervisor(
        loaded.spec,
        plan,
        backend,
        attempt=0,
        bus=EventBus([rec]),
        logs=rec,
        heartbeats=rec,
        interrupt=interrupt or Interrupt(),
        clock=backend.clock,
        bound=bound,
    )


def supervise(
    scripts, n_hosts=3, interrupt=None, bound=None, rec=None, frozen=False, backend_cls=FakeBackend, **sections
):
    """The real supervisor over fake nodes, on the backend's ``FakeClock`` (scripts move it on; ``frozen``:
    only they do); ``rec``: the recorder to use (a script may wait for what the supervisor has heard);
    ``backend_cls``: a FakeBackend whose ``start`` a test changes."""
    loaded, plan = make_plan(n_hosts, **sections)
    backend = backend_cls(scripts, clock=FakeClock())
    if frozen:
        backend.clock.freeze()
    rec = rec if rec is not None else Recorder()
    sup = build_supervisor(loaded, plan, backend, rec, interrupt=interrupt, bound=bound)
    try:
        res = sup.run()
    finally:
        backend.close()
    return res, rec, backend


def exit_code_for_state(state: JobState) -> int:
    from orchestrator.cli.exitcodes import STATE_EXIT_CODES

    return STATE_EXIT_CODES[state]
