"""The one owner of a task's figures (``supervise.figures``): made-up heartbeats.jsonl records in,
steps, step time, steps/s and examples/s out — live while a job runs, over the whole run after it."""

from __future__ import annotations

import json

import pytest

from orchestrator.sinks.files import HeartbeatFile
from orchestrator.supervise.figures import FIGURE_KEYS, MAX_POINTS, Figures, job_rate

TASKS = ("worker:0", "worker:1", "worker:2")


def beat(seq: int, ts: float, steps: int | None = None, examples: int | None = None, **kw) -> dict:
    rec: dict = {"seq": seq, "ts": ts, "cpu_pct": kw.pop("cpu", 50.0)}
    if steps is not None:
        rec["progress"] = {"steps": steps, "examples": examples, "ts": ts, "epoch": 0, "phase": "train", **kw}
    return rec


def window(ts: float, steps: int, step_ms: float, **parts) -> dict:
    return {"kind": "profile", "ts": ts, "steps": steps, "step_ms": step_ms, "collective_ms": 0.0, **parts}


def synchronous(t: float) -> int:
    """Every worker's cumulative steps at ``t``: 5 steps/s for 10 s (warm-up), then 20 steps/s."""
    return int(5 * t) if t <= 10 else 50 + int(20 * (t - 10))


def test_synchronous_workers_get_the_same_rate_whatever_record_came_first():
    """worker:2's first progress record comes 7 s after the others' (its step clock started late):
    a per-task window (first → last record) gives it its own rate; the common window does not."""
    firsts = {"worker:0": 1.0, "worker:1": 1.5, "worker:2": 8.0}
    figs = Figures()
    naive = {}
    for task, first in firsts.items():
        ticks = [first + 0.5 * i for i in range(int((30.0 - first) / 0.5) + 1)]
        for seq, ts in enumerate(ticks):
            figs.add(task, beat(seq, ts, synchronous(ts), 64 * synchronous(ts)))
        naive[task] = (synchronous(ticks[-1]) - synchronous(ticks[0])) / (ticks[-1] - ticks[0])
    assert max(naive.values()) - min(naive.values()) > 2.0  # what report showed: one rate per worker
    final = figs.final()
    rates = {t: f.steps_per_s for t, f in final.items()}
    assert len(set(rates.values())) == 1, rates  # the same to the digit
    assert rates["worker:0"] == pytest.approx((450 - 40) / 22, abs=1e-3)  # from 8 s (all training) to 30 s
    assert len({f.examples_per_s for f in final.values()}) == 1
    assert final["worker:0"].examples_per_s == pytest.approx(64 * (450 - 40) / 22, abs=0.1)
    assert {f.steps for f in final.values()} == {450}
    assert job_rate(final) == (rates["worker:0"], final["worker:0"].examples_per_s)


def test_step_time_is_the_step_clocks_when_there_are_windows_else_the_progress_records_median():
    figs = Figures()
    for seq, (ts, st) in enumerate([(1.0, 0.05), (2.0, 0.30), (3.0, 0.20)]):
        for task in ("worker:0", "worker:1"):
            figs.add(task, beat(seq, ts, 10 * seq + 1, step_time_s=st))
    figs.add("worker:0", window(2.0, 10, 100.0, input_ms=60.0))
    figs.add("worker:0", window(3.0, 30, 200.0, input_ms=20.0))
    final = figs.final()
    assert final["worker:0"].step_time_s == 0.175  # step-weighted: (10 x 100 + 30 x 200) / 40 ms
    assert final["worker:0"].split["input_ms"] == 30.0 and final["worker:0"].split["other_ms"] == 145.0
    assert final["worker:1"].step_time_s == 0.2  # no windows: the median of its records'
    assert final["worker:1"].split is None
    assert figs.live("worker:1").step_time_s == 0.2  # live: the last record's


def test_live_rates_are_recent_and_the_counters_current():
    figs = Figures()
    figs.add("worker:0", beat(0, 0.0, 0, 0))
    assert figs.live("worker:0").steps == 0 and figs.live("worker:0").steps_per_s is None
    figs.add("worker:0", beat(1, 0.5, 5, 320))
    assert figs.live("worker:0").steps_per_s is None  # less than a second: no rate yet
    figs.add("worker:0", beat(2, 1.0, 10, 640))
    figs.add("worker:0", beat(3, 2.0, 40, 2560))
    live = figs.live("worker:0")
    assert (live.steps, live.steps_per_s, live.examples_per_s) == (40, 30.0, 1920.0)  # the last second
    assert live.cpu_pct == 50.0 and figs.live("nobody").steps is None


def test_evaluation_counters_are_not_training_steps():
    figs = Figures()
    figs.add("worker:0", beat(0, 1.0, 100))
    figs.add("worker:0", {"seq": 1, "ts": 2.0, "progress": {"steps": 3, "phase": "test", "ts": 2.0}})
    assert figs.live("worker:0").steps == 100 and figs.final()["worker:0"].steps == 100


def test_attempts_add_up_and_an_older_file_is_split_where_seq_starts_again():
    """A restart: each attempt's processes count from 0; steps add up, each attempt has its window."""

    def records(with_attempt: bool) -> list[tuple[str, dict]]:
        out = []
        for attempt, (t0, n) in enumerate([(0.0, 10), (100.0, 20)]):
            for task in ("worker:0", "worker:1"):
                for seq in range(n + 1):
                    rec = beat(seq, t0 + seq * 0.5, 1 + 2 * seq)  # 4 steps/s
                    out.append((task, {**rec, "attempt": attempt} if with_attempt else rec))
        return out

    for with_attempt in (True, False):
        figs = Figures()
        for task, rec in records(with_attempt):
            figs.add(task, rec)
        f = figs.final()["worker:0"]
        assert f.steps == 21 + 41 and f.steps_per_s == 4.0, (with_attempt, f)
        assert figs.live("worker:0").steps == 41  # this attempt's counter


def test_a_long_run_keeps_bounded_memory_and_the_same_rate():
    figs = Figures()
    n = 5 * MAX_POINTS
    for seq in range(n):
        figs.add("worker:0", beat(seq, float(seq), 1 + 3 * seq))
    span = figs._tasks["worker:0"].spans[0]
    assert len(span.points) <= MAX_POINTS + 1 and span.points[-1].ts == n - 1
    f = figs.final()["worker:0"]
    assert f.steps_per_s == 3.0 and f.steps == 1 + 3 * (n - 1)


def test_damaged_values_are_left_out_not_raised():
    figs = Figures()
    figs.add("worker:0", beat(0, 1.0, 5))
    for bad in (
        {"seq": "x", "progress": {"steps": "7"}},
        {"progress": [1]},
        {"cpu_pct": float("nan")},
        {"seq": 2, "ts": 3.0, "progress": {"steps": -1, "ts": 3.0}},
        {"kind": "profile", "steps": "1"},
    ):
        figs.add("worker:0", bad)
    figs.add("worker:0", beat(3, 4.0, 35))
    f = figs.final()["worker:0"]
    assert (f.steps, f.steps_per_s, f.cpu_pct, f.step_time_s) == (35, 10.0, 50.0, None)


def test_the_file_gives_the_live_figures_to_the_digit(tmp_path):
    """What the supervisor feeds live and writes, and what report reads back: the same figures."""
    live = Figures()
    sink = HeartbeatFile(tmp_path / "heartbeats.jsonl")
    for seq in range(40):
        for i, task in enumerate(TASKS):
            ts = 1_800_000_000.0 + seq * 0.37 + i * 0.013
            rec = {**beat(seq, ts, synchronous(seq * 0.37) + 1, cpu=10.0 + seq / 7), "attempt": 0}
            sink.write(task, rec)
            live.add(task, rec)
            if seq % 9 == 8:
                prof = window(ts, 9, 40.0 + seq / 3, input_ms=1.0 / 3, update_ms=0.1, host_ms=2.0)
                sink.write(task, {**prof, "attempt": 0})
                live.add(task, {**prof, "attempt": 0})
    sink.close()
    replayed = Figures.replay(tmp_path / "heartbeats.jsonl")
    assert replayed.final() == live.final()
    assert all(json.dumps(f.to_dict()) == json.dumps(replayed.final()[t].to_dict()) for t, f in live.final().items())
    assert set(FIGURE_KEYS) == {"steps", "step_time_s", "steps_per_s", "examples_per_s", "cpu_pct", "loss"}
