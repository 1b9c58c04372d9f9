"""The live status snapshot built incrementally, and the pump's batches: a task with news gets a new
row, a task without keeps its row (only its heartbeat's age moves), the monitor's judgements rebuild
only the rows they change, and a silent task among busy ones still turns lost on time."""

from __future__ import annotations

import time

from fakenode import FakeNode, make_plan, obedient
from supervising import supervise

from orchestrator.core.states import JobState, TaskState
from orchestrator.supervise import TaskSession
from orchestrator.supervise.figures import Figures
from orchestrator.supervise.status import Snapshots
from worker_entry import protocol as p

T0 = 1_800_000_000.0


def _snapshots(n: int = 3) -> tuple[Snapshots, Figures, dict[str, TaskSession]]:
    _, plan = make_plan(n)
    sessions = {str(x.task): TaskSession(x) for x in plan.nodes}
    figures = Figures()
    return Snapshots(sessions, figures), figures, sessions


def _build(snap: Snapshots, **judged) -> dict:
    return snap.build(state=JobState.RUNNING, attempt=0, stopping_reason=None, straggler=None, **judged)


def _beat(steps: int, ts: float) -> dict:
    return {"ts": ts, "cpu_pct": 10.0, "progress": {"steps": steps, "ts": ts, "phase": "train"}, "attempt": 0}


def test_a_task_with_news_gets_a_new_row_and_the_others_keep_theirs():
    snap, figures, sessions = _snapshots()
    for t in sessions:
        figures.add(t, _beat(10, T0))
    first = _build(snap)["tasks"]
    assert {e["steps"] for e in first.values()} == {10}
    sessions["worker:0"].heartbeat_wall = time.time() - 5.0
    figures.add("worker:1", _beat(25, T0 + 1))
    snap.touch("worker:1")
    second = _build(snap)["tasks"]
    assert second["worker:1"] is not first["worker:1"] and second["worker:1"]["steps"] == 25
    for t in ("worker:0", "worker:2"):
        assert second[t] is first[t]  # not rebuilt: the same row
        assert second[t]["steps"] == 10
    assert second["worker:0"]["last_heartbeat_age_s"] >= 5.0  # the age is brought up to date all the same
    figures.add("worker:2", _beat(30, T0 + 1))  # news that nobody said: not shown until the task is touched
    assert _build(snap)["tasks"]["worker:2"]["steps"] == 10
    snap.touch("worker:2")
    assert _build(snap)["tasks"]["worker:2"]["steps"] == 30


def test_the_monitors_judgements_rebuild_only_the_rows_they_change():
    snap, _, sessions = _snapshots()
    scores = {t: {"relative": 1.0, "individual": 1.0} for t in sessions}
    rows = _build(snap, scores=scores)["tasks"]
    assert _build(snap, scores=scores)["tasks"]["worker:1"] is rows["worker:1"]  # the same round: nothing to do
    again = _build(snap, scores={**scores, "worker:2": {"relative": 0.5, "individual": 0.8}})["tasks"]
    assert again["worker:2"]["relative_score"] == 0.5 and again["worker:2"]["individual_score"] == 0.8
    assert again["worker:0"] is rows["worker:0"] and again["worker:1"] is rows["worker:1"]
    problem = [{"gpu": 0, "problem": "throttled"}]
    judged = _build(snap, scores={**scores}, gpu_problems={"worker:0": problem})["tasks"]
    assert judged["worker:0"]["gpu_problems"] == problem
    assert judged["worker:1"] is rows["worker:1"]
    cleared = _build(snap, scores={**scores}, gpu_problems={})["tasks"]
    assert cleared["worker:0"]["gpu_problems"] == [] and cleared["worker:2"]["relative_score"] == 1.0


def test_a_silent_task_among_busy_ones_turns_lost_on_time():
    """Eleven workers beat every 50 ms (the pump reads them in batches), one goes silent: it is lost
    after heartbeat.timeout_s (1 s of the supervisor's clock), and the others are stopped, not lost."""

    def goes_silent(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.heartbeat(state="running")
        n.let_pass(1.5)  # past the timeout, on the supervisor's clock
        n.idle(30)

    scripts = {f"worker:{i}": obedient for i in range(12)}
    scripts["worker:7"] = goes_silent
    res, rec, _ = supervise(scripts, n_hosts=12)
    assert res.root_cause.kind == "lost" and res.root_cause.task == "worker:7"
    lost = rec.kinds("worker_lost")
    assert [e.task for e in lost] == ["worker:7"] and 1.0 <= lost[0].silent_s < 3.0
    assert {r.state for t, r in res.tasks.items() if t != "worker:7"} == {TaskState.STOPPED}


def test_the_heap_is_settled_while_the_attempts_run_and_given_back_after():
    import gc

    from orchestrator.supervise.heap import YOUNG, settled_heap

    before = gc.get_threshold()
    with settled_heap():
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] >= YOUNG
        with settled_heap():  # nested (a job run inside another's process): undone only at the outermost
            pass
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] >= YOUNG
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
