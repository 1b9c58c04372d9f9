"""Goodput in `tfcluster report`: the wall time split into productive training and badput, on synthetic
runs (a restart resumed from a backup, a host lost for good, no restart, no step clock, a custom loop
without epochs, a failure before the first step, a run still going). The views, hostile records and the
e2e run are in test_goodput_views.py.
"""

from __future__ import annotations

import pytest
from goodput_runs import T0, _ev, _sum, _training, restart_run

from orchestrator.views.goodput import goodput, goodput_lines
from orchestrator.views.goodputmodel import Goodput


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
