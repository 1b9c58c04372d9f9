"""Goodput in `tfcluster report`: the wall time split into productive training and badput.

Unit tests on synthetic runs (a restart resumed from a backup, no restart, no step clock, a custom loop
without epochs, a failure before the first step, a run still going, hostile records), and one e2e run on
the test bed whose worker is killed mid-run and restarted from its BackupAndRestore backup.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re

import pytest
from conftest import run_cli

from orchestrator.events import BaseEvent, event_from_dict
from orchestrator.runs import RunDir
from orchestrator.views.goodput import CATEGORIES, goodput, goodput_lines
from orchestrator.views.goodputmodel import Goodput
from orchestrator.views.records import clean_heartbeat
from orchestrator.views.report import build_report, report_text

T0 = 1_800_000_000.0
TASKS = ("worker:0", "worker:1")


def _sum(g: dict) -> float:
    return sum(g[k] for k in CATEGORIES)


def _progress(ts: float, steps: int, epoch: int | None, task: str) -> dict:
    prog = {"steps": steps, "ts": ts, "phase": "train", "step_time_s": 0.02}
    if epoch is not None:
        prog["epoch"] = epoch
    return {"task": task, "ts": ts + 0.3, "seq": int(ts - T0), "state": "running", "progress": prog}


def _profile(ts: float, task: str) -> dict:
    """20 ms steps: 4 ms input; worker:0 waits 4 ms for worker:1 inside the 6 ms all-reduce."""
    pre, coll = (10.0, 10.0) if task == "worker:0" else (14.0, 6.0)
    return {
        "task": task,
        "kind": "profile",
        "ts": ts,
        "steps": 100,
        "step_ms": 20.0,
        "input_ms": 4.0,
        "compute_ms": pre - 4.0,
        "collective_ms": coll,
        "update_ms": 0.0,
        "host_ms": 0.0,
        "other_ms": 0.0,
        "pre_collective_ms": pre,
    }


def _training(t0: float, t1: float, epoch_of, profiles: bool = True) -> list[dict]:
    """Training from t0 to t1 on both workers at 50 steps/s: progress records every second in (t0, t1],
    profiles every 2 s."""
    out = []
    for i in range(1, int(t1 - t0) + 1):
        ts = t0 + i
        for task in TASKS:
            out.append(_progress(T0 + ts, 50 * i, epoch_of(ts), task))
            if profiles and i % 2 == 1:
                out.append(_profile(T0 + ts, task))
    return out


def _ev(t: float, event: str, **kw) -> BaseEvent:
    """An event as the views read it from events.jsonl (validated: a fixture must be a whole record)."""
    return event_from_dict({"ts": T0 + t, "event": event, **kw})


def restart_run(profiles: bool = True, epochs: bool = True) -> tuple[list[BaseEvent], list[dict], dict]:
    """Attempt 0 trains epochs 0-2 (10 s each from t=10) and is killed at t=35, in epoch 2; attempt 1
    starts at t=38, resumes at epoch 2 (its first step at t=45) and succeeds; gather 66.1-68."""
    events = [
        _ev(0, "job_started", job="gp", run_id="gp-1", run_dir="runs/gp-1", tasks=2, attempt_limit=2),
        _ev(0.5, "connected", hosts=2, seconds=0.5),
        _ev(1, "attempt_started", attempt=0),
        _ev(35, "teardown", reason="worker:1 killed", grace_s=1.0),
        _ev(36, "attempt_finished", attempt=0, state="failed", root_cause={"kind": "signal", "ts": T0 + 35}),
        _ev(36.5, "restart", attempt=1, max_attempts=2, reason="worker:1 killed"),
        _ev(38, "attempt_started", attempt=1),
        _ev(66, "attempt_finished", attempt=1, state="succeeded", root_cause=None),
        _ev(66.1, "gather_started", attempts=2),
        _ev(68, "gather_finished", files=3, bytes=300, dest="runs/gp-1", already_verified=0, skipped=0, errors=0),
        _ev(68.5, "job_finished", state="succeeded", wall_time_s=68.5, run_dir="runs/gp-1", root_cause=None),
    ]
    ep0 = (lambda t: int((t - 10) // 10)) if epochs else (lambda t: None)
    ep1 = (lambda t: 2 + int((t - 45) // 10)) if epochs else (lambda t: None)
    beats = _training(10, 34, ep0, profiles) + _training(45, 64, ep1, profiles)
    result = {
        "state": "succeeded",
        "started_ts": T0,
        "ended_ts": T0 + 68.4,
        "attempts": [
            {"attempt": 0, "state": "failed", "started_ts": T0 + 1, "ended_ts": T0 + 36, "root_cause": {"ts": T0 + 35}},
            {"attempt": 1, "state": "succeeded", "started_ts": T0 + 38, "ended_ts": T0 + 66, "root_cause": None},
        ],
    }
    return events, beats, result


def test_restart_resumed_from_a_backup():
    g = goodput(*restart_run())
    assert g["wall_s"] == pytest.approx(68.5)
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    a0, a1 = g["attempts"]
    # attempt 0: startup t=0 (connect included) → 10; kept 10 → 29 (the last record of epoch 1: attempt 1
    # resumed at epoch 2); lost 29 → 35 (the failure); 35 → 38 until attempt 1 starts
    assert (a0["startup_s"], a0["training_s"], a0["lost_work_s"], a0["until_next_attempt_s"]) == (10, 19, 6, 3)
    assert "resumed at epoch 2" in a0["backup"]
    assert (a1["startup_s"], a1["training_s"], a1["teardown_s"]) == (7, 19, 2)
    assert g["startup_s"] == pytest.approx(17) and g["redone_s"] == pytest.approx(6) and g["failure_s"] == 3
    assert g["host_lost_s"] == 0  # restarted in place: no host left the run
    # the cost of the failure: t=35 (the failure) → t=45 (attempt 1's first step); redone: the 250 steps
    # reported after the backup (1,200 at t=34 less 950 at t=29)
    assert (a0["cause"], a0["loss_to_training_s"], a0["work_redone_steps"]) == ("restart", 10, 250)
    assert g["recovery"] == {
        "failures": 1,
        "hosts_lost": 0,
        "loss_to_training_s": 10,
        "loss_to_training_max_s": 10,
        "work_redone_s": 6,
        "work_redone_steps": 250,
    }
    assert "cause" not in a1
    assert g["teardown_s"] == pytest.approx(2) and g["gather_s"] == pytest.approx(1.9)
    assert g["other_s"] == pytest.approx(0.6)
    # 38 s of training: 20% of a step waits for input, 20% for the slowest worker
    assert g["input_stall_s"] == pytest.approx(7.6) and g["straggler_wait_s"] == pytest.approx(7.6)
    assert g["productive_s"] == pytest.approx(22.8)
    assert g["goodput"] == pytest.approx(22.8 / 68.5, abs=1e-4)
    assert g["step_clock"] is True and g["finished"] is True
    assert any("BackupAndRestore" in n for n in g["notes"])


def test_a_host_lost_for_good_is_booked_as_recovering_from_a_lost_host():
    """restart_run with worker:1's host lost: silent from t=30, declared lost at t=35 (5 s of silence),
    attempt 1 reshaped without it. The loss counts from its last sign of life, not from the verdict."""
    events, beats, result = restart_run()
    events = [e for e in events if e.event not in ("attempt_finished", "restart")]
    events += [
        _ev(35, "worker_lost", task="worker:1", message="no heartbeat for 5.0s", silent_s=5.0),
        _ev(
            36,
            "attempt_finished",
            attempt=0,
            state="failed",
            root_cause={"kind": "lost", "ts": T0 + 35, "task": "worker:1"},
        ),
        _ev(
            36.5,
            "reshaped",
            task="worker:1",
            host="10.0.0.1",
            attempt=1,
            reason="lost: no heartbeat",
            spare_in=None,
            workers_before=2,
            workers_after=1,
            spares_left=0,
            lost_ts=T0 + 35,
        ),
        _ev(66, "attempt_finished", attempt=1, state="succeeded", root_cause=None),
    ]
    events.sort(key=lambda e: e.ts)
    g = goodput(events, beats, result)
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert (g["host_lost_s"], g["failure_s"], g["redone_s"]) == (3, 0, 6)
    a0 = g["attempts"][0]
    assert (a0["cause"], a0["loss_ts"], a0["loss_to_training_s"]) == ("host_lost", T0 + 30, 15)
    assert g["recovery"]["hosts_lost"] == 1 and g["recovery"]["loss_to_training_s"] == 15
    text = "\n".join(goodput_lines(Goodput.of(g)))
    assert "recovering from a lost host: failure -> new plan" in text
    assert (
        "attempt 0 (host lost for good): loss to training again 15.0 s; work redone 6.0 s (250 steps reported)" in text
    )
    assert "recovery in all: 1 failure(s), 1 host(s) lost" in text


def test_no_restart():
    events, beats, _ = restart_run()
    keep = {"job_started", "connected", "job_finished", "gather_started", "gather_finished"}
    events = [e for e in events if e.event in keep] + [
        _ev(1, "attempt_started", attempt=0),
        _ev(66, "attempt_finished", attempt=0, state="succeeded"),
    ]
    events.sort(key=lambda e: e.ts)
    beats = _training(10, 64, lambda t: int((t - 10) // 10))
    g = goodput(events, beats, {"started_ts": T0, "ended_ts": T0 + 68.4})
    assert g["failure_s"] == 0 and g["startup_s"] == pytest.approx(10) and g["teardown_s"] == pytest.approx(2)
    assert g["input_stall_s"] + g["straggler_wait_s"] + g["productive_s"] == pytest.approx(54)
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert not any("BackupAndRestore" in n for n in g["notes"])


def test_no_step_clock_counts_the_steps_as_productive():
    g = goodput(*restart_run(profiles=False))
    assert g["step_clock"] is False and g["input_stall_s"] == 0 and g["straggler_wait_s"] == 0
    assert g["productive_s"] == pytest.approx(38)
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert any("no step-clock windows" in n for n in g["notes"])


def test_a_late_first_record_is_dated_back_to_the_first_step():
    """Records can come once per epoch: the first one already counts the steps made before it. Attempt 0
    of restart_run with its records before t=19 lost (the first says 450 steps of 20 ms at t=19): its
    training still began at t=10. Without a step time, the rate up to the next record dates it; never
    before the attempt started."""
    events, beats, result = restart_run(profiles=False)
    late = [b for b in beats if not T0 + 10 < b["progress"]["ts"] < T0 + 19]
    a0 = goodput(events, late, result)["attempts"][0]
    assert (a0["startup_s"], a0["training_s"]) == (pytest.approx(10), pytest.approx(19))
    for b in late:
        if b["progress"]["ts"] == T0 + 19:
            b["progress"]["step_time_s"] = 0.5  # its window also held the tracing: the steady steps count
    a0 = goodput(events, late, result)["attempts"][0]
    assert (a0["startup_s"], a0["training_s"]) == (pytest.approx(10), pytest.approx(19))
    for b in late:
        if b["progress"]["ts"] < T0 + 36:
            b["progress"]["step_time_s"] = None  # none known: 450 steps, then 50 more in 1 s
    a0 = goodput(events, late, result)["attempts"][0]
    assert (a0["startup_s"], a0["training_s"]) == (pytest.approx(10), pytest.approx(19))
    for b in late:
        if b["progress"]["ts"] < T0 + 36:
            b["progress"]["step_time_s"] = 1.0  # 450 s before t=19: clamped to the attempt's start
    a0 = goodput(events, late, result)["attempts"][0]
    assert (a0["startup_s"], a0["training_s"]) == (pytest.approx(1), pytest.approx(28))


def test_without_backup_evidence_the_whole_attempt_is_lost():
    """A custom loop reports no epochs: nothing says what the restart kept."""
    g = goodput(*restart_run(epochs=False))
    a0 = g["attempts"][0]
    assert a0["training_s"] == 0 and a0["lost_work_s"] == pytest.approx(25)  # t=10 → 35
    assert "no backup evidence" in a0["backup"]
    assert g["redone_s"] == pytest.approx(25) and g["failure_s"] == pytest.approx(3)
    assert a0["work_redone_steps"] == 1200  # every step it reported: nothing was kept
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)


def test_resumed_from_scratch_and_a_final_failure():
    """Attempt 1 starts again at epoch 0 (no backup) and fails too: the job fails; neither kept anything."""
    events, beats, _ = restart_run()
    beats = [b for b in beats if b["ts"] < T0 + 40] + _training(45, 60, lambda t: int((t - 45) // 10))
    events = [e for e in events if e.event not in ("attempt_finished", "gather_started", "gather_finished")]
    events += [
        _ev(36, "attempt_finished", attempt=0, state="failed", root_cause={"ts": T0 + 35}),
        _ev(61, "attempt_finished", attempt=1, state="failed", root_cause={"ts": T0 + 60.5}),
    ]
    events.sort(key=lambda e: e.ts)
    g = goodput(events, beats, {"started_ts": T0, "ended_ts": T0 + 68.4, "attempts": "damaged"})
    a0, a1 = g["attempts"]
    assert a0["training_s"] == 0 and "nothing it trained was kept" in a0["backup"]
    # the final failure: no later attempt, but attempt 0 proved no backups either → all of it is lost
    assert a1["training_s"] == 0 and a1["lost_work_s"] == pytest.approx(15.5) and a1["teardown_s"] == pytest.approx(0.5)
    assert g["productive_s"] == 0 and g["goodput"] == 0
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)


def test_a_failure_before_the_first_step_is_startup_then_failure():
    events, beats, result = restart_run()
    beats = [b for b in beats if b["ts"] > T0 + 40]  # attempt 0 never made a step
    g = goodput(events, beats, result)
    a0 = g["attempts"][0]
    assert a0["startup_s"] == pytest.approx(35) and a0["until_next_attempt_s"] == pytest.approx(3)
    assert "training_s" not in a0 and g["startup_s"] == pytest.approx(42)
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)


def test_a_run_still_going_counts_up_to_its_latest_record():
    events, beats, _ = restart_run()
    events = [e for e in events if e.ts <= T0 + 49.5]
    beats = [b for b in beats if b["ts"] <= T0 + 49.5]
    g = goodput(events, beats, None, finished=False)
    assert g["finished"] is False and g["wall_s"] == pytest.approx(49.3)  # the last heartbeat: t=49.3
    assert g["attempts"][1]["training_s"] == pytest.approx(4)  # first step t=45, latest t=49
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert goodput([], [], None) is None


def _plan() -> dict:
    return {"job": "gp", "nodes": [{"host": f"10.0.0.{i}", "task": {"type": "worker", "index": i}} for i in (0, 1)]}


def _write_run(path, events, beats, result, plan=None) -> RunDir:
    plan = _plan() if plan is None else plan
    (path / "plan.json").write_text(json.dumps(plan))
    lines = (e.to_dict() if isinstance(e, BaseEvent) else e for e in events)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (path / "heartbeats.jsonl").write_text("".join(json.dumps(b) + "\n" for b in beats))
    if result is not None:
        (path / "result.json").write_text(json.dumps(result))
    return RunDir(path)


def test_the_cost_of_a_failure_is_in_tensorboard_and_the_html_page(tmp_path):
    """The same figures as the report's, as TensorBoard scalars at the run's end and on the HTML page."""
    from orchestrator.views.htmlpage import Page
    from orchestrator.views.tensorboard import end_scalars

    run = _write_run(tmp_path, *restart_run())
    _, _, values = end_scalars(run)
    assert values["recovery/loss_to_training_s"] == 10 and values["recovery/work_redone_steps"] == 250
    assert values["recovery/failures"] == 1 and values["recovery/hosts_lost"] == 0
    assert values["goodput/redone_s"] == pytest.approx(6) and values["goodput/host_lost_s"] == 0
    page = Page("t")
    page.goodput_bar(build_report(run).goodput)
    html = page.render()
    assert "work redone: training since the last backup: 6.0 s" in html
    assert "attempt 0 (restart in place): loss to training again 10.0 s; work redone 6.0 s (250 steps reported)" in html


def test_report_json_and_text_carry_goodput(tmp_path):
    run = _write_run(tmp_path, *restart_run())
    rep = build_report(run)
    assert rep.goodput.seconds["productive_s"] == pytest.approx(22.8)
    text = report_text(rep)
    assert "goodput 33.3% of 68.5 s wall time:" in text
    assert re.search(r"work redone: training since the last backup\s+6\.0 s\s+8\.8%", text)
    assert re.search(r"restarting in place after a failure\s+3\.0 s\s+4\.4%", text)
    assert "attempt 0 (restart in place): loss to training again 10.0 s; work redone 6.0 s (250 steps reported)" in text
    assert "attempt 0: lost 6.0 s of training (the next attempt resumed at epoch 2)" in text
    r = run_cli("report", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["goodput"]["failure_s"] == pytest.approx(3)
    assert json.loads(r.stdout)["goodput"]["recovery"]["work_redone_steps"] == 250
    narrowed = build_report(run, last_s=10)  # --last narrows the step times; goodput stays whole-run
    assert narrowed.goodput.wall_s == rep.goodput.wall_s
    assert "(of the whole run: --last narrows" in report_text(narrowed)


HOSTILE = ["x", None, [], {}, [1, "a"], {"ts": "x"}, -5, 1e300, True, "NaN", 3.5, 0]


def _damage(rec, rng: random.Random):
    """Replace a random field (also nested ones) with a hostile value, or drop it."""
    target = rec
    while isinstance(target, dict) and target and rng.random() < 0.5:
        nested = [v for v in target.values() if isinstance(v, dict)]
        if not nested:
            break
        target = rng.choice(nested)
    if isinstance(target, dict) and target:
        key = rng.choice(sorted(target))
        if rng.random() < 0.2:
            del target[key]
        else:
            target[key] = copy.deepcopy(rng.choice(HOSTILE))
    return rec


def test_hostile_and_truncated_records_never_traceback(tmp_path):
    events, beats, result = restart_run()
    rng = random.Random(14)
    for i in range(150):
        d = tmp_path / f"r{i}"
        d.mkdir()
        ev, bs, res = copy.deepcopy(([e.to_dict() for e in events], beats, result))
        for recs in (ev, bs, res["attempts"]):
            for rec in rng.sample(recs, k=min(len(recs), rng.randint(1, 6))):
                _damage(rec, rng)
        if i % 3 == 0:
            _damage(res, rng)
        plan = _plan()
        for rec in (plan, *plan["nodes"]) if i % 4 == 0 else ():
            _damage(rec, rng)
        run = _write_run(d, ev, bs, res if i % 5 else rng.choice(HOSTILE), plan)
        with open(run.heartbeats_jsonl, "a") as f:
            f.write('{"task": "worker:0", "kind": "prof')  # torn by a crash mid-write
        with open(run.events_jsonl, "a") as f:
            f.write("[1, 2]\n\x00\xff garbage\n")
        rep = build_report(run)
        report_text(rep)
        g = rep.goodput.to_dict() if rep.goodput else None
        if g is not None:
            assert all(math.isfinite(g[k]) and g[k] >= 0 for k in CATEGORIES), g
            assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01, rel=1e-9)
    # damaged plan.json and result.json, and nothing else
    d = tmp_path / "bare"
    d.mkdir()
    (d / "plan.json").write_text('{"job": "x", "nodes": [1, {"task": "w"}, {"task": {}, "env": []}]')
    (d / "result.json").write_text("[]")
    rep = build_report(RunDir(d))
    assert rep.goodput is None and "goodput" not in report_text(rep)


def test_cleaning_keeps_good_records_and_unknown_fields():
    beat = {"task": "worker:0", "ts": T0, "seq": 1, "new_field": "from a newer launcher", "progress": {"steps": 3}}
    assert clean_heartbeat(dict(beat)) == beat
    assert clean_heartbeat({**beat, "progress": {"steps": "3"}}) == {k: v for k, v in beat.items() if k != "progress"}
    assert clean_heartbeat({**beat, "ts": float("nan")}) is None
    assert clean_heartbeat({**beat, "task": ["worker:0"]}) is None
    assert event_from_dict({"ts": T0, "event": "attempt_started", "attempt": 1, "new": "field"}).attempt == 1
    with pytest.raises(ValueError, match=r"^attempt_started\.ts: expected"):
        event_from_dict({"ts": "T0", "event": "attempt_started", "attempt": 1})
    damaged = {"ts": T0, "event": "attempt_finished", "attempt": 0, "state": "failed", "root_cause": "x"}
    assert event_from_dict(damaged).root_cause is None  # the event stays: goodput needs it


# --- e2e: a real run whose worker is killed mid-run and restarted from its backup --------------------


@pytest.mark.e2e
def test_goodput_of_a_real_run_with_a_restart(restarted_run):
    """worker:1 SIGKILLed once 2 of 6 epochs are backed up, the job restarted and resumed
    (``shared_runs.restarted_run``, the run test_restart_e2e asserts on too)."""
    run_dir = restarted_run.run_dir
    assert restarted_run.rc == 0, restarted_run.stderr[-3000:]  # (the fixture saw no job process left)
    from orchestrator.runs import RunDir
    from orchestrator.views.report import build_report
    from orchestrator.views.runsummary import read_summary

    saved = read_summary(RunDir(run_dir))  # the run's end wrote RUN/summary.json, and report reads it:
    assert saved is not None and saved.report == build_report(RunDir(run_dir))  # the records' report
    r = run_cli("report", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["goodput"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["restarts"] == 1 and g["finished"] is True
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    first, second = g["attempts"]
    assert (first["state"], second["state"]) == ("failed", "succeeded")
    assert first["startup_s"] > 0 and second["startup_s"] > 0  # TensorFlow starts again after the restart
    assert g["failure_s"] > 0 and first["until_next_attempt_s"] > 0
    assert "resumed at epoch" in first["backup"] and first["training_s"] > 0  # epochs 1-2 were kept
    assert g["productive_s"] > 0 and 0 < g["goodput"] < 1
    assert all(g[k] >= 0 for k in CATEGORIES)
    text = run_cli("report", str(run_dir)).stdout
    assert "goodput" in text and "attempt 0: lost" in text


def test_the_others_wait_for_an_input_bound_worker_is_booked_as_input_naming_it(monkeypatch):
    """worker:1 is 4 ms per step late because its input pipeline takes 8 ms where worker:0's takes 4: the
    4 ms worker:0 waits for it inside the all-reduce is input's cost (issue 32: "how much did input cost
    me"), named, and no longer "waiting for the slowest worker"."""
    base = goodput(*restart_run())

    plain = _profile

    def slow_input(ts: float, task: str) -> dict:
        rec = plain(ts, task)
        if task == "worker:1":
            rec.update(input_ms=8.0, compute_ms=6.0)  # the same 14 ms before the all-reduce, its excess all input
        return rec

    monkeypatch.setitem(globals(), "_profile", slow_input)
    g = goodput(*restart_run())
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert g["productive_s"] == pytest.approx(base["productive_s"])  # the same time, booked to its cause
    assert g["straggler_wait_s"] == pytest.approx(0.0, abs=1e-6)
    assert g["input_stall_s"] == pytest.approx(base["input_stall_s"] + base["straggler_wait_s"])
    assert g["input_waits"] == {"worker:1": pytest.approx(7.6)}
    assert base["input_waits"] == {}  # a worker late in its compute: still the slowest worker's wait
    lines = "\n".join(goodput_lines(Goodput.of(g)))
    assert "of which the others waiting for worker:1's input" in lines and "7.6 s" in lines
