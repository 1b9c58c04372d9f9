"""A touched task's status entry brought up to date in place of being built anew (``status.refreshed``)
is the entry ``task_status`` builds, to the byte of status.json (key order included): random seconds of
heartbeats, figures, state changes, exits, restarts, hellos, straggler and GPU judgements, score rounds
and evaluations, the incremental snapshot against one built from scratch every second."""

from __future__ import annotations

import json
import random

import pytest
from fakenode import make_plan
from test_status_incremental import T0, _beat

from orchestrator.core.states import JobState, TaskState
from orchestrator.events import kinds as ev
from orchestrator.supervise import TaskSession
from orchestrator.supervise import status as status_mod
from orchestrator.supervise.figures import Figures
from orchestrator.supervise.status import Snapshots
from worker_entry import protocol as p
from worker_entry.protocol.samples import GpuSample

STATES = [TaskState.RUNNING, TaskState.STOPPING, TaskState.FAILED, TaskState.SUCCEEDED]


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def time(self) -> float:
        return self.now


def _heartbeat(rng: random.Random, seq: int) -> p.Heartbeat:
    gpus = [GpuSample(index=0, util=rng.choice((None, 50.0)), mem_used_mb=100)] if rng.random() < 0.3 else None
    return p.Heartbeat(
        seq=seq, ts=T0 + seq, state=rng.choice(("R", "S", "T", None)), rss_mb=rng.choice((None, 5.0)), gpus=gpus
    )


def _bytes(status: dict) -> bytes:
    return json.dumps(status, sort_keys=False).encode()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_refreshed_entry_is_the_one_built_anew(monkeypatch, seed):
    clock = _Clock()
    monkeypatch.setattr(status_mod, "time", clock)
    _, plan = make_plan(6)
    sessions = {str(x.task): TaskSession(x) for x in plan.nodes}
    names = sorted(sessions)
    figures = Figures()
    snap = Snapshots(sessions, figures)
    rng = random.Random(seed)
    straggler, problems, scores = None, {}, {}
    refreshed = 0
    for sec in range(60):
        clock.now = T0 + sec + 0.5
        for t in rng.sample(names, rng.randint(1, len(names))):
            s = sessions[t]
            roll = rng.random()
            if roll < 0.6:
                s.heartbeat, s.heartbeat_wall = _heartbeat(rng, sec), T0 + sec + rng.random() / 3
                figures.add(t, _beat(10 * sec + rng.choice((0, 5)), T0 + sec))
            elif roll < 0.7:
                s.state = rng.choice(STATES)
            elif roll < 0.75:
                s.exit = p.Exited(code=rng.choice((0, 1)), signal_name=rng.choice((None, "SIGKILL")))
            elif roll < 0.8:
                s.pid, s.restarts = rng.randint(2, 9), s.restarts + rng.choice((0, 1))
            elif roll < 0.85:
                s.facts = p.NodeFacts(hostname=f"h{rng.randint(0, 3)}")
            elif roll < 0.9:
                s.started_how = rng.choice((None, "strategy"))
            elif roll < 0.95:
                e = ev.Evaluation(
                    task=t, host=s.host, count=sec, metrics={"acc": sec / 60}, step=sec, checkpoint=None, source="x"
                )
                snap.evaluated(e)
                continue  # (``evaluated`` touches it)
            snap.touch(t)
        if rng.random() < 0.1:
            straggler = rng.choice((None, *names))
        if rng.random() < 0.1:
            problems = {t: [{"gpu": 0, "problem": "throttled"}] for t in rng.sample(names, 2)}
        if rng.random() < 0.2:  # a round: new scores, most of them the same values
            scores = {t: {"relative": rng.choice((1.0, 0.5)), "individual": 1.0} for t in names}
        before = dict(snap._entries)
        judged = {"straggler": straggler, "gpu_problems": problems, "scores": scores}
        got = snap.build(state=JobState.RUNNING, attempt=0, stopping_reason=None, **judged)
        fresh = Snapshots(sessions, figures, snap.evaluations)
        fresh._straggler = None
        want = fresh.build(state=JobState.RUNNING, attempt=0, stopping_reason=None, **judged)
        assert _bytes(got) == _bytes(want)
        refreshed += sum(1 for t, e in got["tasks"].items() if e is not before[t] and before[t])
    assert refreshed > 50  # the path under test was taken


def test_a_published_entry_is_not_changed_by_the_next_refresh(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(status_mod, "time", clock)
    _, plan = make_plan(2)
    sessions = {str(x.task): TaskSession(x) for x in plan.nodes}
    figures = Figures()
    snap = Snapshots(sessions, figures)
    s = sessions["worker:0"]
    s.heartbeat, s.heartbeat_wall = p.Heartbeat(seq=0, rss_mb=1.0), T0
    first = snap.build(state=JobState.RUNNING, attempt=0, stopping_reason=None, straggler=None)
    kept = json.dumps(first["tasks"]["worker:0"])
    s.heartbeat, s.heartbeat_wall = p.Heartbeat(seq=1, rss_mb=2.0), T0 + 1
    figures.add("worker:0", _beat(50, T0 + 1))
    snap.touch("worker:0")
    second = snap.build(state=JobState.RUNNING, attempt=0, stopping_reason=None, straggler=None)
    assert second["tasks"]["worker:0"]["rss_mb"] == 2.0 and second["tasks"]["worker:0"]["steps"] == 50
    assert json.dumps(first["tasks"]["worker:0"]) == kept
