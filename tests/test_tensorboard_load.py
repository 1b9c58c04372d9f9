"""TensorBoard at 4,096 tasks: the writes stay at ~``TASKS_PER_SECOND`` a second however many tasks
start at once and however often the straggler scores change; a slow write (thousands of event files
opened on a busy launcher) holds up points, never the records the supervisor queues."""

from __future__ import annotations

import time

from orchestrator.sinks.tensorboard import QUEUE_SIZE, TASKS_PER_SECOND, Scalars, TensorBoardSink


def test_tensorboard_first_points_of_a_large_job_are_spread_at_tasks_per_second():
    """4,096 tasks' first heartbeats come within a second: their first points (each a new event file) are
    written TASKS_PER_SECOND a second, not all at once; a job of at most that many tasks writes each at once."""
    tasks = 4 * TASKS_PER_SECOND + 7
    sc = Scalars(min_interval_s=tasks / TASKS_PER_SECOND)
    written: dict[int, list[str]] = {}
    for second in range(12):  # 1 Hz heartbeats, every task's within the same second
        for i in range(tasks):
            rec = {"ts": 1000.0 + second + i / (2 * tasks), "attempt": 0, "progress": {"steps": second}, "cpu_pct": 1.0}
            written.setdefault(second, []).extend(p.run for p in sc.record(f"worker:{i}", rec))
    assert [len(written[s]) for s in range(5)] == [TASKS_PER_SECOND] * 4 + [7]
    assert written[0] == [f"worker-{i}" for i in range(TASKS_PER_SECOND)]  # in the order they came
    firsts = [run for s in range(5) for run in written[s]]
    assert sorted(firsts) == sorted(f"worker-{i}" for i in range(tasks))  # each once
    assert max(len(w) for w in written.values()) == TASKS_PER_SECOND  # and so on: never more a second
    small = Scalars(min_interval_s=1.0)
    firsts = [small.record(f"worker:{i}", {"ts": 5.0, "progress": {"steps": 1}, "cpu_pct": 1.0}) for i in range(3)]
    assert all(len(points) == 1 for points in firsts)


def test_tensorboard_scores_of_a_large_job_at_most_once_per_interval_a_straggler_at_once():
    sc = Scalars(min_interval_s=64.0)
    sc.record("worker:0", {"ts": 100.0, "attempt": 0, "progress": {"steps": 1}, "cpu_pct": 1.0})

    def scores(wall: float, rel: float, straggler: bool = False) -> list[str]:
        st = {"state": "running", "relative_score": rel, "individual_score": rel, "straggler": straggler}
        return [p.run for p in sc.status({"updated": wall, "tasks": {"worker:0": st}})]

    assert scores(101.0, 1.0) == ["worker-0", "job"]  # the first
    assert scores(106.0, 1.1) == ["job"]  # changed, within the interval: not yet
    assert scores(111.0, 1.9, straggler=True) == ["worker-0", "job"]  # named: at once
    assert scores(116.0, 2.0, straggler=True) == ["job"]
    assert scores(176.0, 2.1, straggler=True) == ["worker-0", "job"]  # the interval passed
    small = Scalars(min_interval_s=1.0)  # a small job: every change, as before
    small.record("worker:0", {"ts": 100.0, "attempt": 0, "progress": {"steps": 1}, "cpu_pct": 1.0})
    for i, wall in enumerate((101.0, 101.5, 102.0)):
        st = {"state": "running", "relative_score": 1.0 + i, "individual_score": 1.0}
        assert [p.run for p in small.status({"updated": wall, "tasks": {"worker:0": st}})] == ["worker-0", "job"]


class SlowFiles:
    """The sink's event files, their first writes slow (each a new file opened while the launcher is busy)."""

    def __init__(self, slow: int, seconds: float) -> None:
        self.points: list = []
        self.slow, self.seconds = slow, seconds
        self.failed: dict = {}

    def add(self, point) -> None:
        if len(self.points) < self.slow:
            time.sleep(self.seconds)
        self.points.append(point)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_slow_event_file_writes_hold_up_points_not_the_records_queue(tmp_path):
    tasks = [f"worker:{i}" for i in range(300)]
    sink = TensorBoardSink(tmp_path / "tb", tasks, flush_s=0.1)
    files = sink.files = SlowFiles(slow=4, seconds=0.5)  # 2 s of stalled writes, as 4,096 opens were
    sent = 0
    end = time.monotonic() + 2.5
    while time.monotonic() < end:  # ~5,000 records a second, as 4,096 tasks send: the queue holds 8,192
        for _ in range(25):
            i = sent % len(tasks)
            ts = 1000.0 + sent // len(tasks)
            sink.write(
                tasks[i], {"ts": ts, "attempt": 0, "progress": {"steps": 1 + sent // len(tasks)}, "cpu_pct": 1.0}
            )
            sent += 1
        time.sleep(0.005)
    sink.close()
    assert sent > QUEUE_SIZE and sink.dropped == 0 and sink.dropped_points == 0, (sent, sink.problems)
    assert sink.problems == []
    seconds = 1 + (sent - 1) // len(tasks)
    # each task's first point, then one every interval (4.7 s here): every point the records made
    assert {p.run for p in files.points} == {t.replace(":", "-") for t in tasks}
    assert len(files.points) >= min(seconds, TASKS_PER_SECOND)
