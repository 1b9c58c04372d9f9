"""The launcher's per-task state kept as records come, and its per-tick scans cut (issue 33 item 4):
each shortcut gives what the full computation gives — a task's live row is its live figures, an
incrementally built snapshot is the one built from scratch, and a silent, stopped or stepless task
turns lost, hung or stalled at the very tick a scan of every task would have said it."""

from __future__ import annotations

import math
import random

from fakenode import make_plan
from test_status_incremental import T0, _beat, _build

from orchestrator.sinks.tensorboard import Scalars
from orchestrator.supervise import Monitor, Policy, TaskSession, evidence, host_suspect
from orchestrator.supervise.figures import Figures
from orchestrator.supervise.status import Snapshots
from worker_entry import protocol as p

POLICY = Policy(interval_s=1.0, timeout_s=10.0, startup_timeout_s=60.0, progress_timeout_s=30.0)


def _records(rng: random.Random, n: int) -> list[dict]:
    """Heartbeats of one task: steps that grow, stall, restart with a new attempt, odd fields."""
    out, steps, ts, attempt = [], 0, T0, 0
    for i in range(n):
        ts += rng.choice((0.3, 1.0, 1.0, 2.5))
        steps += rng.choice((0, 5, 20))
        if rng.random() < 0.05:
            attempt, steps = attempt + 1, 0
        rec = _beat(steps, ts) | {"attempt": attempt, "seq": i}
        prog = rec["progress"]
        if rng.random() < 0.5:
            prog["examples"], prog["step_time_s"] = steps * 32, rng.choice((0.05, None))
        if rng.random() < 0.5:
            prog["loss"] = {"sum": 0.5 * steps, "steps": steps}
        if rng.random() < 0.1:
            prog["phase"] = "eval"
        if rng.random() < 0.1:
            rec["cpu_pct"] = None
        out.append(rec)
    return out


def test_a_tasks_kept_live_row_is_its_live_figures_after_every_record():
    rng = random.Random(7)
    kept, plain = Figures(), Figures()
    kept.track_live()
    for task in ("worker:0", "worker:1"):
        for rec in _records(rng, 300):
            kept.add(task, rec)
            plain.add(task, rec)
            want = plain.live(task)
            assert kept.live_row(task) == {"epoch": want.epoch, **want.to_dict()}
            assert kept.live(task) == want
    assert kept.live_row("worker:9") == {"epoch": None, **Figures().live("worker:9").to_dict()}


def test_an_incremental_snapshot_is_the_one_built_from_scratch():
    _, plan = make_plan(6)
    sessions = {str(x.task): TaskSession(x) for x in plan.nodes}
    figures = Figures()
    snap = Snapshots(sessions, figures)
    rng = random.Random(3)
    for sec in range(20):
        news = rng.sample(sorted(sessions), 3)  # half the tasks have news each second
        for t in news:
            figures.add(t, _beat(10 * sec, T0 + sec))
            snap.touch(t)
        got = _build(snap)["tasks"]
        fresh = _build(Snapshots(sessions, figures))["tasks"]
        assert got == fresh
        for t in set(sessions) - set(news):  # a task without news kept its row (its age aside)
            assert got[t]["steps"] == fresh[t]["steps"]


def _run(tasks: list[str], silent_from: dict[str, float], stepless_from: dict[str, float], until: float):
    """Heartbeats every second from every task until it falls silent (steps growing until it stops
    stepping); checks at 10 Hz. The verdicts by (kind, task) -> the tick they came at; asserted the
    same as those of a monitor made to scan every task at every tick (the code before the bounds)."""
    got, full = Monitor(tasks, POLICY, now=0.0), Monitor(tasks, POLICY, now=0.0)
    for m in (got, full):
        m.arm(0.0)
    verdicts = _drive(got, silent_from, stepless_from, until, full=False)
    assert verdicts == _drive(full, silent_from, stepless_from, until, full=True)
    return verdicts


def _drive(monitor: Monitor, silent_from, stepless_from, until: float, *, full: bool):
    seen: dict[tuple[str, str | None], float] = {}
    tick = 0
    for sec in range(int(until)):
        for t in monitor.watch:
            if sec < silent_from.get(t, 1e9):
                steps = min(sec, int(stepless_from.get(t, 1e9))) * 10
                monitor.on_heartbeat(t, p.Heartbeat.from_dict({"seq": sec, "state": "running"}), float(sec))
                monitor.on_steps(t, steps, float(sec))
        for _ in range(10):
            now = tick / 10
            tick += 1
            if full:  # every bound says a verdict may be due: the scan of every task, every tick
                monitor._floors.exact, monitor._floors.seen = False, -1e9
            for v in monitor.check(now):
                seen.setdefault((v.kind, v.task), now)
    return seen


def test_a_silent_task_among_many_turns_lost_at_the_tick_a_full_scan_says():
    tasks = [f"worker:{i}" for i in range(200)]
    silent = {"worker:17": 5.0, "worker:150": 23.0}
    got = _run(tasks, silent, {}, 40.0)
    # heard last at 4 s and 22 s: lost at the first 10 Hz tick more than 10 s later (and worker:17,
    # lost but not ended, without a step for the progress timeout while the others step: hung too)
    assert got == {("lost", "worker:17"): 14.1, ("lost", "worker:150"): 32.1, ("hung", "worker:17"): 34.1}


def test_a_task_heard_late_with_an_older_time_is_still_judged_from_that_time():
    m = Monitor(["worker:0", "worker:1"], POLICY, now=0.0)
    m.arm(0.0)
    for now in (5.0, 9.0):
        m.seen("worker:0", now)
        m.seen("worker:1", now)
    assert m.check(9.0) == []
    m.seen("worker:1", 2.0)  # (an observation stamped before the last check)
    assert [(v.kind, v.task) for v in m.check(12.1)] == [("lost", "worker:1")]


def test_a_stepless_worker_turns_hung_and_a_stepless_job_stalled_on_time():
    tasks = [f"worker:{i}" for i in range(50)]
    got = _run(tasks, {}, {"worker:9": 10.0}, 45.0)
    assert got == {("hung", "worker:9"): 40.1}  # its steps last changed at 10 s, the others' go on
    got = _run(tasks, {}, dict.fromkeys(tasks, 6.0), 45.0)
    assert got == {("stalled", None): 36.1}


def test_the_task_with_the_newest_step_ending_leaves_the_others_judged_stalled_on_time():
    tasks = ["worker:0", "worker:1", "worker:2"]
    m = Monitor(tasks, POLICY, now=0.0)
    m.arm(0.0)
    for t in tasks:
        m.seen(t, 1.0)
        m.on_steps(t, 10, 1.0)
    m.on_steps("worker:2", 20, 8.0)  # the newest step change: its task then ends
    assert m.check(8.0) == []
    m.on_terminal("worker:2")
    for now in (20.0, 31.0):
        for t in tasks[:2]:
            m.seen(t, now)
        assert m.check(now) == []
    m.seen("worker:0", 31.2)
    m.seen("worker:1", 31.2)
    assert [(v.kind, v.task) for v in m.check(31.2)] == [("stalled", None)]  # 30.2 s since 1.0


def test_a_stopped_process_is_hung_on_time_and_the_startup_deadline_still_names_the_late():
    tasks = [f"worker:{i}" for i in range(20)]
    m = Monitor(tasks, POLICY, now=0.0)
    m.arm(0.0)
    for t in tasks[:-1]:
        m.on_started(t, 1.0)
    for sec in range(2, 8):
        for t in tasks:
            state = "stopped" if t == "worker:3" and sec >= 4 else "running"
            m.on_heartbeat(t, p.Heartbeat.from_dict({"seq": sec, "state": state}), float(sec))
        out = [(v.kind, v.task) for v in m.check(float(sec))]
        assert out == ([("hung", "worker:3")] if sec == 6 else []), sec  # stopped_after_s: 2 intervals
    for t in tasks:
        m.seen(t, 61.0)
    assert [(v.kind, v.task) for v in m.check(61.0)] == [("startup_timeout", "worker:19")]
    assert m.check(61.5) == []


def _sample(rng: random.Random) -> dict:
    """A host sample with any of its keys missing, ints where floats may come, zeros."""
    keys = ("throttled_pct", "steal_pct", "cpu_mhz", "cpu_max_mhz", "run_ms", "wait_ms", "wait_pct")
    out = {k: rng.choice((None, 0, 0.0, rng.uniform(0, 100), rng.randint(1, 3000))) for k in keys}
    out["tcp_retrans_pct"] = rng.choice((None, rng.uniform(0, 5)))
    return {k: v for k, v in out.items() if v is not None or rng.random() < 0.5}


def test_a_workers_host_digest_is_what_each_key_read_alone_gives():
    rng = random.Random(11)
    for _ in range(2000):
        ss = [_sample(rng) for _ in range(rng.randint(1, 3))]
        d = evidence._digest(ss)
        assert d.throttled == evidence._mean([s.get("throttled_pct") for s in ss])
        assert d.steal == evidence._mean([s.get("steal_pct") for s in ss])
        assert (d.mhz, d.max_mhz) == tuple(evidence._mean([s.get(k) for s in ss]) for k in ("cpu_mhz", "cpu_max_mhz"))
        assert d.odds == evidence._wait_odds(ss)
        assert d.retrans == evidence._median_of(ss, "tcp_retrans_pct")


def test_a_straggler_round_among_hundreds_names_the_starved_worker_each_cause_as_before():
    quiet = {"interval_s": 1.0, "run_ms": 900.0, "wait_ms": 100.0, "wait_pct": 10.0, "steal_pct": 1.0}
    named = {
        "throttled_pct": ({"throttled_pct": 60.0, "quota_cpus": 0.5}, "throttled it 60% of the time (quota 0.5 CPU)"),
        "run-queue": ({"run_ms": 200.0, "wait_ms": 800.0}, "waited for a CPU 80% of the time"),
        "steal": ({"steal_pct": 40.0}, "steals 40% of its host's CPU time"),
        "clock": ({"cpu_mhz": 1000.0, "cpu_max_mhz": 3000.0}, "1.00 GHz of 3.00 GHz"),
        "link": ({"tcp_retrans_pct": 6.0, "net_errors": 4}, "retransmits 6.0% of its TCP segments"),
    }
    workers = [f"worker:{i}" for i in range(300)]
    for extra, text in named.values():
        samples = {t: [dict(quiet, cpu_mhz=3000.0, cpu_max_mhz=3000.0, tcp_retrans_pct=0.1)] * 3 for t in workers}
        samples["worker:123"] = [{**samples["worker:123"][0], **extra}] * 3
        f = host_suspect(samples)
        assert f is not None and f.task == "worker:123" and text in f.detail, (extra, f)
    assert host_suspect({t: [quiet] * 3 for t in workers}) is None


def test_tensorboard_scalars_fast_paths_keep_json_types_apart():
    sc = Scalars(min_interval_s=1.0)
    beat = {"ts": 100.0, "attempt": 0, "progress": {"steps": 5, "phase": "train"}, "cpu_pct": 50.0}
    assert [(p.run, p.step, p.wall) for p in sc.record("worker:0", beat)] == [("worker-0", 5, 100.0)]
    # a bool is not an attempt nor a step count; an int time counts; NaN and inf are not numbers
    odd = {"ts": 102, "attempt": True, "progress": {"steps": True}, "cpu_pct": math.nan, "rss_mb": math.inf}
    assert sc.record("worker:0", odd) == []  # nothing finite to write
    assert sc.tasks["worker:0"].written == 102.0
    assert sc.tasks["worker:0"].attempt == 0 and sc.tasks["worker:0"].steps == 5
    sc.record("worker:0", {"ts": 110.0, "attempt": 1, "progress": {"steps": 2}})
    assert sc.tasks["worker:0"].step == 7  # a new attempt counts on from the last one's steps
    status = {"updated": 111.0, "tasks": {"worker:0": {"state": "running", "steps_per_s": 2.0}, "x": None}}
    (job,) = sc.status(status)
    assert job.values == {"tasks/running": 1.0} and sc.tasks["worker:0"].rates == (2.0, None, None)
