"""The supervision policy, pure: made-up heartbeats and times in, verdicts out."""

from __future__ import annotations

from orchestrator.plan import StragglerPolicy
from orchestrator.supervise import Monitor, Policy, find_straggler
from worker_entry import protocol as p

TASKS = ["worker:0", "worker:1", "worker:2"]
POLICY = Policy(interval_s=1.0, timeout_s=10.0, startup_timeout_s=60.0, progress_timeout_s=30.0)


def beat(fields: dict) -> p.Heartbeat:
    """A heartbeat as the supervisor hands it to the monitor: parsed and validated."""
    return p.Heartbeat.from_dict({"seq": 0, **fields})


def beat_all(m: Monitor, now: float, **hb) -> None:
    for t in TASKS:
        m.on_heartbeat(t, beat({"state": "running", **hb}), now)


def kinds(verdicts) -> list[tuple[str, str | None]]:
    return [(v.kind, v.task) for v in verdicts]


def test_silence_past_timeout_is_lost_once():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    for t in range(0, 10):
        beat_all(m, float(t))
    for t in TASKS[:2]:
        m.on_heartbeat(t, beat({"state": "running"}), 15.0)
    assert m.check(15.0) == []  # worker:2 silent for 6 s < 10 s
    out = m.check(19.5)
    assert kinds(out) == [("lost", "worker:2")] and out[0].fatal
    assert "no heartbeat for 10.5s" in out[0].message
    assert m.check(25.0) == [] or all(v.task != "worker:2" for v in m.check(25.0))


def test_silent_past_timeout_during_teardown_only_after_go_and_not_done():
    m = Monitor(TASKS, POLICY, now=0.0)
    assert m.silent_past_timeout(50.0) == []  # before the go: the startup deadline rules
    m.arm(0.0)
    beat_all(m, 1.0)
    for t in ("worker:0", "worker:1"):
        m.on_heartbeat(t, beat({"state": "stopping"}), 10.5)
    assert m.silent_past_timeout(10.5) == []  # worker:2 silent 9.5 s < 10 s
    assert m.silent_past_timeout(11.0) == ["worker:2"]
    m.on_terminal("worker:2")
    assert m.silent_past_timeout(30.0) == ["worker:0", "worker:1"]  # done tasks are never listed


def test_finished_task_is_never_lost():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    beat_all(m, 1.0)
    m.on_terminal("worker:1")
    for t in ("worker:0", "worker:2"):
        m.on_heartbeat(t, beat({"state": "running"}), 20.0)
    assert ("lost", "worker:1") not in kinds(m.check(20.0))


def test_stopped_process_is_hung_after_two_intervals():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    beat_all(m, 1.0)
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 2.0)
    assert m.check(2.5) == []
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 3.0)
    assert m.check(3.5) == []
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 4.0)
    out = m.check(4.0)
    assert kinds(out) == [("hung", "worker:1")]
    assert "stopped (state stopped" in out[0].message


def test_stopped_then_continued_is_not_hung():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 1.0)
    m.on_heartbeat("worker:1", beat({"state": "running"}), 2.0)
    beat_all(m, 3.0)
    assert m.check(5.0) == []


def test_startup_deadline_names_the_tasks_that_never_started():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    m.on_started("worker:0", 5.0)
    m.on_started("worker:2", 6.0)
    for t in range(0, 62, 2):
        beat_all(m, float(t))
    assert m.check(59.0) == []
    out = m.check(61.0)
    assert kinds(out) == [("startup_timeout", "worker:1")]
    assert out[0].data["not_started"] == ["worker:1"]
    assert m.check(62.0) == []  # reported once


def test_startup_deadline_names_an_idle_late_task_before_a_busy_one():
    """A late task busy on the CPU in its last beats is slow (a loaded box), not stuck: the idle one is
    named first; a busy beat older than the window, or none at all (no psutil), counts as idle."""

    def late_at(cpu: dict[str, list[tuple[float, float]]]) -> list[str]:
        m = Monitor(TASKS, POLICY, now=0.0)
        m.arm(0.0)
        m.on_started("worker:1", 1.0)
        for t in range(0, 62, 2):
            beat_all(m, float(t))
        for task, beats in cpu.items():
            for now, pct in beats:
                m.on_heartbeat(task, beat({"state": "running", "cpu_pct": pct}), now)
        (v,) = m.check(61.0)
        assert v.kind == "startup_timeout" and v.task == v.data["not_started"][0]
        return v.data["not_started"]

    assert late_at({}) == ["worker:0", "worker:2"]  # no evidence: plan order, as before
    assert late_at({"worker:0": [(60.0, 90.0)], "worker:2": [(60.0, 0.0)]}) == ["worker:2", "worker:0"]
    assert late_at({"worker:0": [(50.0, 90.0), (60.0, 0.0)]}) == ["worker:0", "worker:2"]  # busy 11 s ago
    assert late_at({"worker:0": [(58.0, 4.0)]}) == ["worker:0", "worker:2"]  # below BUSY_PCT: idle
    assert late_at({t: [(60.0, 50.0)] for t in TASKS}) == ["worker:0", "worker:2"]  # all busy: all named


def test_no_startup_check_before_arming():
    m = Monitor(TASKS, POLICY, now=0.0)
    beat_all(m, 100.0)
    assert m.check(100.0) == []


def test_whole_job_without_progress_is_stalled():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    for t in range(0, 20):
        beat_all(m, float(t), progress={"steps": t * 10})
    for t in range(20, 51):
        beat_all(m, float(t), progress={"steps": 190})
    out = m.check(50.0)
    assert kinds(out) == [("stalled", None)]
    assert "no training step on any worker for 31s" in out[0].message


def test_one_worker_without_progress_while_others_progress_is_hung():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    for t in range(0, 45):
        for task in TASKS:
            steps = 5 if task == "worker:2" else t * 10
            m.on_heartbeat(task, beat({"state": "running", "progress": {"steps": steps}}), float(t))
    out = m.check(44.0)
    assert kinds(out) == [("hung", "worker:2")]
    assert "while other workers progress" in out[0].message


def test_suspects_are_the_silent_and_the_stopped():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.arm(0.0)
    beat_all(m, 1.0)
    m.on_heartbeat("worker:0", beat({"state": "running"}), 5.0)
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 5.0)
    out = m.suspects(5.0, exclude="worker:0")
    assert kinds(out) == [("hung", "worker:1"), ("lost", "worker:2")]
    assert all(v.data["suspect"] for v in out)
    fresh = Monitor(TASKS, POLICY, now=0.0)
    beat_all(fresh, 1.0)
    assert fresh.suspects(1.5) == []  # everyone heard from recently, nobody stopped


def test_before_the_go_a_task_still_starting_is_no_suspect():
    """A peer failing before the go (its handshake refused) is its own fault: a task not yet heard from
    because its interpreter starts slowly is not named for it (the startup deadline judges it)."""
    m = Monitor(TASKS, POLICY, now=0.0)
    m.on_heartbeat("worker:1", beat({"state": "stopped"}), 1.0)
    assert m.suspects(30.0, exclude="worker:0") == []
    m.arm(30.0)
    assert kinds(m.suspects(40.0, exclude="worker:0")) == [("hung", "worker:1"), ("lost", "worker:2")]


# --- stragglers ------------------------------------------------------------------------------


def profile(pre, step=100.0, inp=1.0, cpu=20.0, coll=None):
    return {
        "pre_collective_ms": pre,
        "step_ms": step,
        "input_ms": inp,
        "cpu_ms": cpu,
        "collective_ms": coll if coll is not None else step - pre,
    }


def test_find_straggler_input_bound():
    f = find_straggler({"worker:0": profile(2.5), "worker:1": profile(47.0, inp=44.0), "worker:2": profile(3.0)})
    assert f is not None and f.task == "worker:1"
    assert f.cause == "input pipeline"
    assert round(f.wait_ms, 2) == 44.25
    assert f.share == f.wait_ms / 100.0


def test_find_straggler_compute_bound():
    f = find_straggler(
        {"worker:0": profile(3.0, cpu=20.0), "worker:1": profile(3.5, cpu=21.0), "worker:2": profile(40.0, cpu=60.0)},
    )
    assert f is not None and (f.task, f.cause) == ("worker:2", "compute")


def test_find_straggler_other_cause():
    f = find_straggler({"worker:0": profile(3.0), "worker:1": profile(3.0), "worker:2": profile(30.0)})
    assert f is not None and f.cause == "other"


def test_homogeneous_noise_is_not_a_straggler():
    assert find_straggler({"worker:0": profile(3.0), "worker:1": profile(4.0), "worker:2": profile(3.5)}) is None
    # ratio high but absolute excess tiny
    assert find_straggler({"worker:0": profile(0.5), "worker:1": profile(0.5), "worker:2": profile(3.0)}) is None
    # absolute excess large but ratio below threshold
    assert find_straggler({"worker:0": profile(40.0), "worker:1": profile(42.0), "worker:2": profile(55.0)}) is None


def test_single_worker_has_no_straggler():
    assert find_straggler({"worker:0": profile(50.0)}) is None


def feed_round(m, now, pres, **kw):
    out = []
    for t, pre in zip(TASKS, pres, strict=True):
        out += m.on_profile(t, profile(pre, **kw), now)
    return out


def test_straggler_needs_two_consecutive_rounds_and_clears_after_two():
    m = Monitor(TASKS, POLICY, now=0.0)
    assert feed_round(m, 10.0, [3, 47, 3]) == []
    out = feed_round(m, 20.0, [3, 47, 3])
    assert kinds(out) == [("straggler", "worker:1")]
    assert not out[0].fatal
    assert "wait ≈44 ms per step" in out[0].message
    assert m.straggler == "worker:1"
    assert feed_round(m, 30.0, [3, 47, 3]) == []  # reported once
    assert feed_round(m, 40.0, [3, 3.5, 3]) == []
    assert kinds(feed_round(m, 50.0, [3, 3.5, 3])) == [("straggler_cleared", "worker:1")]
    assert m.straggler is None


def test_an_input_bound_straggler_is_named_live_with_its_remedy():
    m = Monitor(TASKS, POLICY, now=0.0)
    for now in (10.0, 20.0):
        out = [v for t, pre in zip(TASKS, [3, 47, 3], strict=True) for v in m.on_profile(
            t, profile(pre, inp=44.0 if t == "worker:1" else 1.0), now
        )]  # fmt: skip
    ((v,),) = [[v for v in out if v.kind == "straggler"]]
    assert v.data["cause"] == "input pipeline" and "Remedy: end its tf.data pipeline with .prefetch(" in v.message
    assert "tf.data.experimental.service" in v.message
    m2 = Monitor(TASKS, POLICY, now=0.0)
    feed_round(m2, 10.0, [3, 47, 3], cpu=20.0)
    (other,) = feed_round(m2, 20.0, [3, 47, 3])
    assert "Remedy" not in other.message  # a cause without a remedy to give gets none


def test_alternating_noise_never_confirms():
    m = Monitor(TASKS, POLICY, now=0.0)
    for i, pres in enumerate([[3, 47, 3], [47, 3, 3], [3, 3, 47], [3, 47, 3], [47, 3, 3]]):
        assert feed_round(m, 10.0 * i, pres) == []


def test_kill_stragglers_makes_it_fatal():
    m = Monitor(TASKS, Policy(stragglers=StragglerPolicy(kill=True)), now=0.0)
    feed_round(m, 1.0, [3, 3, 60])
    out = feed_round(m, 2.0, [3, 3, 60])
    assert kinds(out) == [("straggler", "worker:2")] and out[0].fatal


def test_round_waits_for_every_live_worker():
    m = Monitor(TASKS, POLICY, now=0.0)
    m.on_profile("worker:0", profile(3), 1.0)
    m.on_profile("worker:1", profile(47), 1.0)
    m.on_profile("worker:1", profile(47), 2.0)  # a second sample before worker:2 reported: same round
    assert m._round == 0
    m.on_profile("worker:2", profile(3), 3.0)
    assert m._round == 1


def test_small_share_of_a_long_step_is_not_a_straggler():
    # 12 ms extra on a 400 ms step: 3% — noise on a busy host, not worth a warning
    profiles = {
        "worker:0": profile(4.0, step=400),
        "worker:1": profile(16.0, step=400),
        "worker:2": profile(4.5, step=400),
    }
    assert find_straggler(profiles) is None
    assert find_straggler(profiles, StragglerPolicy(min_share=0.0)) is not None


def test_compute_excess_from_the_step_clock_names_compute():
    prof = {t: profile(2.4, step=30.0, inp=2.2) for t in TASKS}
    for t in TASKS:
        prof[t]["compute_ms"] = 0.2
    prof["worker:1"] = {**profile(15.8, step=30.0, inp=2.1), "compute_ms": 13.6}
    f = find_straggler(prof)
    assert f is not None and (f.task, f.cause) == ("worker:1", "compute")
    assert "forward/backward pass takes 13.4 ms/step longer" in f.detail


def test_workers_stopping_together_are_stalled_not_one_hung():
    """One worker hangs inside the loop: every worker stops at the same step, their last progress
    arriving a few ms apart. That is a stalled job, not one worker hung "while others progress"."""
    m = Monitor(TASKS, POLICY, now=0.0)
    for t in range(31):
        for k, task in enumerate(TASKS):
            m.on_heartbeat(task, beat({"state": "running", "progress": {"steps": 60}}), float(t) + 0.005 * k)
    out = m.check(30.004)  # past the first worker's limit, not yet past the last one's
    assert out == []
    out = m.check(30.02)
    assert [(v.kind, v.task) for v in out] == [("stalled", None)]
