"""The step clock, pure: rows → steps, windows, the stamp ring and its reader, progress ownership, the
modes from the environment. The stamps in real TensorFlow are in test_stepclock_tf.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker_entry.instrument import progress
from worker_entry.instrument.stepclock import collectives, devsync, stamps
from worker_entry.instrument.stepclock import reader as stampreader
from worker_entry.instrument.stepclock import timeline as stepclock
from worker_entry.instrument.stepclock.ring import COLLECTIVE, COLS, RUN, Ring, Row
from worker_entry.instrument.stepclock.timeline import Timeline, summarize

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0  # seconds since the epoch, like tf.timestamp()


def t(ms: float) -> float:
    return T0 + ms / 1e3


def run_row(start, data, done, *inline, fn=1, replica=0) -> Row:
    """A replica function's row: times in ms; ``inline`` = (call, enter, exit) collectives."""
    return Row(replica, RUN, fn, len(inline), t(start), t(data), t(done), tuple((c, t(a), t(b)) for c, a, b in inline))


def coll_row(call, enter, exit_, fn=1, replica=0) -> Row:
    return Row(replica, COLLECTIVE, fn, call, t(enter), t(exit_))


def approx(x):
    return pytest.approx(x, abs=2e-3)


def timeline(primary=frozenset({0}), runs=True) -> Timeline:
    return Timeline(lambda fn: primary, lambda fn: runs)


# ------------------------------------------------------------------------------ the timeline (pure)


def test_steps_are_spans_between_gradient_all_reduces_and_every_instant_has_one_part():
    tl = timeline()
    first = tl.feed([run_row(0, 4, 12, (0, 6, 9))])  # input 4, compute 2, all-reduce 3, update 3
    assert len(first) == 1 and first[0].warmup  # the first step of a function: tracing, setup
    (s,) = tl.feed([run_row(15, 20, 31, (0, 27, 29))])  # host 3 (12→15), input 5, compute 7, AR 2
    assert not s.warmup and s.step_ms == approx(29 - 9)
    # the previous step's update (9→12) belongs to this step: it starts at the last all-reduce's exit
    assert s.parts == approx({"input": 5, "compute": 7, "collective": 2, "update": 3, "host": 3, "other": 0})
    assert sum(s.parts.values()) == approx(s.step_ms)
    assert s.local_ms == approx(18)


def test_gradient_accumulation_one_step_spans_the_k_executions_before_the_all_reduce():
    tl = timeline()
    tl.feed([run_row(0, 1, 5, (0, 3, 4))])
    rows = [run_row(6 + 10 * k, 8 + 10 * k, 14 + 10 * k) for k in range(3)]  # 3 micro-steps, no collective
    assert tl.feed(rows) == []  # no all-reduce: the step is not over
    (s,) = tl.feed([run_row(36, 38, 50, (0, 44, 46))])  # the 4th execution all-reduces
    assert s.step_ms == approx(46 - 4)
    assert s.parts["input"] == approx(4 * 2) and s.parts["compute"] == approx(3 * 6 + 6)
    assert s.parts["collective"] == approx(2) and s.parts["update"] == approx(1)  # 4 -> 5
    assert sum(s.parts.values()) == approx(s.step_ms)


def test_other_collectives_count_as_collective_time_and_the_step_waits_for_its_run_row():
    tl = timeline(primary=frozenset({1}))
    tl.feed([run_row(0, 1, 9, (0, 2, 3), (1, 4, 6))])
    # a loss strategy.reduce after strategy.run: its own row, then the next run
    assert tl.feed([coll_row(2, 10, 12)]) == []
    (s,) = tl.feed([run_row(14, 15, 25, (0, 16, 17), (1, 20, 22))])
    assert s.step_ms == approx(22 - 6)
    # 6-9 update, 9-10 host, 10-12 collective (the reduce), 12-14 host, 14-15 input, 15-16 compute,
    # 16-17 collective (a non-primary all-reduce, e.g. a synchronized batch norm), 17-20 compute, 20-22 AR
    assert s.parts == approx({"input": 1, "compute": 4, "collective": 5, "update": 3, "host": 3, "other": 0})


def test_collective_rows_without_run_stamps_leave_the_rest_unattributed():
    tl = timeline(runs=False)
    tl.feed([coll_row(0, 5, 6)])
    (s,) = tl.feed([coll_row(0, 15, 17)])
    assert s.parts == approx({"input": 0, "compute": 0, "collective": 2, "update": 0, "host": 0, "other": 9})


def test_eager_next_calls_between_executions_are_input_time():
    tl = timeline()
    tl.feed([run_row(0, 0, 5, (0, 2, 3))])
    (s,) = tl.feed([run_row(20, 20, 30, (0, 25, 27))], inputs=[(t(8), t(17))])
    assert s.parts["input"] == approx(9) and s.parts["host"] == approx(20 - 5 - 9)
    assert sum(s.parts.values()) == approx(s.step_ms)


def test_unrolled_steps_several_primaries_in_one_run_and_two_replicas():
    tl = timeline(primary=frozenset({0, 1}))
    steps = tl.feed([run_row(0, 1, 20, (0, 5, 6), (1, 12, 14))])
    assert len(steps) == 2 and steps[1].step_ms == approx(8)
    a, b = Timeline(lambda fn: frozenset({0})), Timeline(lambda fn: frozenset({0}))
    assert len(a.feed([run_row(0, 1, 3, (0, 2, 2.5), replica=0)])) == 1
    assert len(b.feed([run_row(0, 1, 3, (0, 2, 2.5), replica=1)])) == 1


def test_each_step_carries_the_examples_of_the_executions_it_spans():
    tl = timeline()
    (first,) = tl.feed([run_row(0, 1, 5, (0, 3, 4))._replace(examples=64.0)])
    assert first.examples == 64.0
    micro = [run_row(6 + 10 * k, 8 + 10 * k, 14 + 10 * k)._replace(examples=32.0) for k in range(3)]
    assert tl.feed(micro) == []  # gradient accumulation: no all-reduce yet
    (s,) = tl.feed([run_row(36, 38, 50, (0, 44, 46))._replace(examples=10.0)])  # a partial last micro-batch
    assert s.examples == 3 * 32 + 10
    (s,) = tl.feed([run_row(52, 53, 60, (0, 55, 56))])  # no batch input (0): unknown
    assert s.examples is None
    tl = Timeline(lambda fn: frozenset({0}), lambda fn: False)
    tl.feed([coll_row(0, 1, 2)])
    (s,) = tl.feed([coll_row(0, 12, 13)])  # steps without replica-function rows: unknown
    assert s.examples is None


def test_reader_counts_the_examples_of_every_local_replica():
    """Two local replicas of a worker in a job of 4 replicas: each row carries its batch x 4 / 2; the
    worker counts the sum, whole examples only (fractions wait), unknown when one step has none."""
    counted = []
    rows = []
    reader = stampreader.Reader(
        60.0,
        take=lambda: [rows.pop(0) for _ in range(len(rows))],
        take_inputs=lambda: [],
        primaries=lambda fn: frozenset({0}),
        has_runs=lambda fn: True,
        emit=lambda *a, **k: None,
        count=lambda n, ex, at: counted.append((n, ex)),
    )
    for k in range(3):
        for replica, batch in ((0, 16), (1, 15)):  # an uneven partial batch: 16 + 15
            rows.append(
                run_row(10 * k, 10 * k + 1, 10 * k + 9, (0, 10 * k + 3, 10 * k + 8), replica=replica)._replace(
                    examples=batch * 2.0 + 0.25
                )
            )
    reader.poll()
    assert counted == [(3, 3 * (62 + 0.5) // 1)]  # 187.5: 187 now, the half later
    rows.append(run_row(40, 41, 49, (0, 43, 48), replica=0)._replace(examples=32.5))
    rows.append(run_row(40, 41, 49, (0, 43, 48), replica=1)._replace(examples=32.0))
    reader.poll()
    assert counted[-1] == (1, 65)
    rows.append(run_row(50, 51, 59, (0, 53, 58), replica=0))
    reader.poll()
    assert counted[-1] == (1, None)


def test_summary_is_additive_trimmed_and_names_local_time():
    steps = [
        stepclock.StepSplit(1, 0, 10.0, {**dict.fromkeys(stepclock.CATEGORIES, 0.0), "compute": 6.0, "collective": 4.0})
    ] * 18
    steps += [
        stepclock.StepSplit(
            1, 0, 500.0, {**dict.fromkeys(stepclock.CATEGORIES, 0.0), "host": 490.0, "collective": 10.0}
        )
    ] * 2
    rec = summarize(steps, cpu_s=0.2, counted=20)
    assert rec["steps"] == 20 and rec["step_ms"] == approx(10) and rec["compute_ms"] == approx(6)
    assert rec["host_ms"] == approx(0)  # the two outliers (a checkpoint, an evaluation) are trimmed
    assert sum(rec[f"{k}_ms"] for k in stepclock.CATEGORIES) == approx(rec["step_ms"])
    assert rec["pre_collective_ms"] == approx(6) and rec["cpu_ms"] == approx(10)
    json.dumps(rec, allow_nan=False)


# ------------------------------------------------------------------------------ ring, reader, progress


class _Var:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def test_ring_takes_only_rows_whose_index_matches():
    import numpy as np

    ring = Ring.__new__(Ring)
    ring.replica, ring.size, ring.read_upto, ring.lost = 0, 4, 0, 0
    table = np.full((4, COLS), -1.0)
    for i in range(6):  # 6 rows written into 4 slots: rows 0 and 1 were overwritten
        table[i % 4, :7] = [i, COLLECTIVE, 1, 0, 10.0 + i, 11.0 + i, 0.0]
    table[5 % 4, 0] = 1.0  # row 5 counted but not written yet (the slot still holds row 1)
    ring.count, ring.rows = _Var(5), _Var(table)
    rows = ring.take()
    assert [r.a for r in rows] == [12.0, 13.0, 14.0] and ring.lost == 2 and ring.read_upto == 5
    table[5 % 4, 0] = 5.0
    assert [r.a for r in ring.take()] == [15.0]


def test_reader_counts_steps_and_emits_the_slowest_replica_per_window():
    rows: list[Row] = []
    records, counts = [], []
    now = [0.0]
    reader = stampreader.Reader(
        2.0,
        min_steps=2,
        take=lambda: [rows.pop(0) for _ in range(len(rows))],
        take_inputs=list,
        primaries=lambda fn: frozenset({0}),
        has_runs=lambda fn: True,
        emit=lambda kind, **kw: records.append(kw),
        count=lambda n, ex, at: counts.append((n, ex)),
        clock=lambda: now[0],
        cpu=lambda: 0.0,
    )
    for k in range(6):
        base = 10 * k
        rows.append(run_row(base, base + 1, base + 9, (0, base + 3, base + 8), replica=0)._replace(examples=32.0))
        rows.append(
            run_row(base, base + 1, base + 9, (0, base + 7, base + 8), replica=1)._replace(examples=32.0)
        )  # works 4 ms longer
    assert reader.poll() == 6 and counts == [(6, 6 * 64)]
    assert records == []  # the window (2 s) is not over
    now[0] = 3.0
    rows.append(run_row(60, 61, 69, (0, 63, 68), replica=0))
    rows.append(run_row(60, 61, 69, (0, 67, 68), replica=1))
    reader.poll()
    (rec,) = records
    assert rec["compute_ms"] == approx(6) and rec["collective_ms"] == approx(1)  # replica 1's
    assert rec["steps"] == 7 and rec["stamps"] == "auto"  # GPU tensors' stamps wait for completion


def test_the_last_window_is_written_when_the_process_exits_before_it_is_due():
    """A job shorter than one window still gets its split: the final round writes what it has."""
    rows: list[Row] = []
    records = []
    reader = stampreader.Reader(
        60.0,
        min_steps=3,
        take=lambda: [rows.pop(0) for _ in range(len(rows))],
        take_inputs=list,
        primaries=lambda fn: frozenset({0}),
        has_runs=lambda fn: True,
        emit=lambda kind, **kw: records.append(kw),
        count=lambda n, ex, at: None,
        clock=lambda: 0.0,
        cpu=lambda: 0.0,
    )
    for k in range(2):
        rows.append(run_row(10 * k, 10 * k + 1, 10 * k + 9, (0, 10 * k + 3, 10 * k + 8), replica=0))
    reader.poll()
    reader.poll(final=True)
    assert records == []  # fewer than min_steps: not a window worth reporting
    for k in range(2, 6):
        rows.append(run_row(10 * k, 10 * k + 1, 10 * k + 9, (0, 10 * k + 3, 10 * k + 8), replica=0))
    reader.poll()
    assert records == []  # not due
    reader.poll(final=True)
    assert len(records) == 1 and records[0]["steps"] >= 3


def test_progress_ownership_stamps_outrank_the_callback_user_outranks_both(monkeypatch):
    emitted = []
    monkeypatch.setattr(progress, "emit", lambda kind, **kw: emitted.append(kw) or True)
    c = progress.StepCounter("train", min_interval_s=0.0)
    c.add(1, None, 0, source="callback")
    c.add(3, None, None, source="stamps")  # the stamps take over; their first poll's duration is unknown
    c.add(1, None, 2, source="callback")  # only the epoch
    c.add(2, None, None, source="stamps")
    assert c.owner == "stamps" and c.steps == 6 and c.epoch == 2
    c.examples_per_step = 32
    c.add(1, None, None, source="stamps")
    assert c.examples == 32
    c.add(5, None, None)  # report_step
    assert c.owner == "user" and c.steps == 12
    assert [e["steps"] for e in emitted][-1] == 12
    # the step clock claims the count when its first function is traced, before Keras's first batch
    # ends: the callback's early batches are not counted twice
    c = progress.StepCounter("train", min_interval_s=0.0)
    c.claim("stamps")
    c.add(1, None, 0, source="callback")
    c.add(1, None, 0, source="callback")
    c.add(2, None, None, source="stamps")
    assert c.steps == 2 and c.owner == "stamps"
    c.claim("callback")
    assert c.owner == "stamps"


def test_modes_and_sync_modes_from_env():
    assert stamps.mode({}) == "auto"
    assert stamps.mode({"TFCLUSTER_STEPCLOCK": "1"}) == "force"
    assert stamps.mode({"TFCLUSTER_STEPCLOCK": "0"}) == "off"
    assert stamps.mode({"TFCLUSTER_PROFILER": "1"}) == "off"  # the profiler instead
    assert devsync.sync_mode({}) == "auto" and devsync.sync_mode({"TFCLUSTER_STAMP_SYNC": "1"}) == "force"
    assert devsync.needs_sync("/job:worker/replica:0/task:1/device:GPU:0", "auto")
    assert not devsync.needs_sync("/job:worker/replica:0/task:1/device:CPU:0", "auto")
    assert devsync.needs_sync("/device:CPU:0", "force") and not devsync.needs_sync("/device:GPU:0", "off")


def test_patches_are_idempotent():
    class Ops:
        def _all_reduce(self, reduce_op, value, replica_id, options):
            return value

    class Mod:
        CollectiveAllReduce = Ops

    assert collectives.patch_cross_device_ops(Mod) is True and collectives.patch_cross_device_ops(Mod) is False
    assert Ops()._all_reduce(None, [1], 0, None) == [1]  # outside a tf.function trace: as is
