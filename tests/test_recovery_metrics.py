"""The cost of a failure on /metrics while the job runs (issue 34, item 8): the live watcher fed the
events and status snapshots a run with a lost host produces, the same figures as the recorded run's
goodput (tests/test_goodput.py's host-lost run: loss to training again 15 s, 250 steps and 6 s redone),
and the Prometheus families a scrape shows."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.events import event_from_dict
from orchestrator.sinks.metrics import JobMetrics, _Collector
from orchestrator.sinks.recovery import RecoveryWatch

T0 = 1_800_000_000.0
TASKS = ("worker:0", "worker:1")


def _ev(t: float, event: str, **kw):
    return event_from_dict({"ts": T0 + t, "event": event, **kw})


def _status(t: float, attempt: int, steps: int | None, epoch: int | None) -> dict:
    task = {"steps": steps, "epoch": epoch, "step_time_s": 0.02, "state": "running"}
    return {"attempt": attempt, "updated": T0 + t, "tasks": dict.fromkeys(TASKS, task)}


def feed(sink, reshaped: bool = True, verdict: bool = True) -> None:
    """Attempt 0 from t=1, 50 steps/s from t=10 in 10-s epochs; worker:1 silent from t=30, lost at t=35;
    attempt 1 (reshaped, or a restart) from t=38 resumes at epoch 2, its first snapshot at t=46."""
    sink.handle(_ev(1, "attempt_started", attempt=0))
    sink.update(_status(5, 0, None, None))  # starting: no step yet
    for i in range(1, 25):
        sink.update(_status(10 + i, 0, 50 * i, (10 + i - 10) // 10))
    if verdict:
        sink.handle(_ev(35, "worker_lost", task="worker:1", message="no heartbeat for 5.0s", silent_s=5.0))
    root = {"kind": "lost", "ts": T0 + 35, "task": "worker:1"}
    sink.handle(_ev(36, "attempt_finished", attempt=0, state="failed", root_cause=root))
    sink.update(_status(36.5, 0, 1200, 2))  # a late snapshot of the failed attempt changes nothing
    if reshaped:
        sink.handle(
            _ev(
                36.5,
                "reshaped",
                task="worker:1",
                host="10.0.0.2",
                attempt=1,
                reason="lost: no heartbeat",
                workers_before=2,
                workers_after=1,
                spares_left=0,
                lost_ts=T0 + 35,
            )
        )
    sink.handle(_ev(38, "attempt_started", attempt=1))
    sink.update(_status(40, 1, None, None))
    sink.update(_status(46, 1, 50, 2))  # 50 steps of 20 ms: the first step at t=45
    sink.update(_status(47, 1, 100, 2))


def test_a_lost_host_costs_what_the_recorded_run_says():
    w = RecoveryWatch()
    feed(w)
    d = w.done
    assert d.count == {"host_lost": 1}
    assert d.last_loss_to_training_s == pytest.approx(15)  # t=30 (last sign of life) → t=45
    assert d.work_redone_steps == 250 and d.work_redone_s == pytest.approx(6)  # t=29 (epoch 1's end) → 35


def test_a_restart_in_place_without_a_verdict_counts_from_the_failure():
    w = RecoveryWatch()
    feed(w, reshaped=False, verdict=False)
    assert w.done.count == {"restart": 1} and w.done.last_loss_to_training_s == pytest.approx(10)


def test_a_resume_at_epoch_0_redoes_all_of_it_and_success_is_no_failure():
    w = RecoveryWatch()
    w.handle(_ev(1, "attempt_started", attempt=0))
    for i in range(1, 5):
        w.update(_status(10 + i, 0, 50 * i, 0))
    w.handle(_ev(16, "attempt_finished", attempt=0, state="failed", root_cause={"kind": "exit", "ts": T0 + 15}))
    w.handle(_ev(17, "attempt_started", attempt=1))
    w.update(_status(21, 1, 50, 0))
    assert w.done.work_redone_steps == 200 and w.done.work_redone_s == pytest.approx(15 - 10)
    w.handle(_ev(30, "attempt_finished", attempt=1, state="succeeded", root_cause=None))
    w.handle(_ev(31, "attempt_started", attempt=2))
    w.update(_status(33, 2, 50, 0))
    assert w.done.count == {"restart": 1}  # a success leaves nothing to recover from


def test_hostile_snapshots_are_ignored():
    w = RecoveryWatch()
    w.handle(_ev(1, "attempt_started", attempt=0))
    for bad in (
        {},
        {"attempt": 0, "updated": "soon", "tasks": {}},
        {"attempt": 0, "updated": T0 + 2, "tasks": []},
        {"attempt": 0, "updated": T0 + 2, "tasks": {"w": {"steps": float("nan"), "epoch": True}}},
        {"attempt": 0, "updated": T0 + 2, "tasks": {"w": "x"}},
    ):
        w.update(bad)
    assert w.attempt is not None and w.attempt.first is None and w.done.count == {}


def scrape(m: JobMetrics) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(m))
    out: dict = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_figures_are_prometheus_metrics():
    m = JobMetrics("fake", "fake-1")
    before = scrape(m)
    assert before[("tfcluster_job_recoveries_total", (("cause", "host_lost"), ("job", "fake")))] == 0
    assert not any(name == "tfcluster_job_last_loss_to_training_seconds" for name, _ in before)  # no failure yet
    feed(m)
    got = scrape(m)
    job = (("job", "fake"),)
    assert got[("tfcluster_job_recoveries_total", (("cause", "host_lost"), ("job", "fake")))] == 1
    assert got[("tfcluster_job_recoveries_total", (("cause", "restart"), ("job", "fake")))] == 0
    assert got[("tfcluster_job_last_loss_to_training_seconds", job)] == pytest.approx(15)
    assert got[("tfcluster_job_loss_to_training_seconds_total", job)] == pytest.approx(15)
    assert got[("tfcluster_job_work_redone_steps_total", job)] == 250
    assert got[("tfcluster_job_work_redone_seconds_total", job)] == pytest.approx(6)
