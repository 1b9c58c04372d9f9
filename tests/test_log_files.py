"""Each task's log file of an attempt: created at its first line, and there (empty) for a task that
printed nothing once the attempt's files close — the gather and the hand-over compare the node's log
with it. Opening thousands before the first hello was 1.7 s of a 4,096-task start."""

from __future__ import annotations

import io
import random
import resource
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.backends import limits
from orchestrator.runs import RunDir, logline
from orchestrator.sinks.logs import LogRouter

TASKS = [("worker:0", "worker-0", "h0"), ("worker:1", "worker-1", "h1"), ("worker:2", "worker-2", "h2")]


def _router(tmp_path: Path) -> tuple[LogRouter, RunDir]:
    run = RunDir(tmp_path / "run")
    (tmp_path / "run" / "logs").mkdir(parents=True)
    router = LogRouter(run, out=io.BytesIO(), color=False)
    router.open_attempt(0, TASKS)
    return router, run


def test_a_tasks_file_is_made_at_its_first_line_and_every_task_has_one_when_the_attempt_ends(tmp_path):
    router, run = _router(tmp_path)
    assert not any(run.logs_dir.glob("*.log"))  # nothing made before a task speaks
    router.write("worker:1", b"hello\n")
    router.flush()
    assert [p.name for p in run.logs_dir.glob("*.log")] == ["worker-1.log"]
    assert run.task_log("worker-1").read_bytes() == b"hello\n"
    router.open_attempt(1, TASKS)  # the next attempt: the last one's files close, the silent ones made
    assert sorted(p.name for p in run.logs_dir.glob("*.log")) == ["worker-0.log", "worker-1.log", "worker-2.log"]
    assert run.task_log("worker-0").read_bytes() == b""
    router.write("worker:2", b"again\n")
    router.close()
    assert run.task_log("worker-2", 1).read_bytes() == b"again\n"
    assert run.task_log("worker-0", 1).read_bytes() == b"" and run.task_log("worker-1", 1).is_file()
    assert (run.task_log("worker-1").stat().st_mode & 0o777) == 0o600  # private, as before


def test_a_file_that_cannot_be_made_is_one_warning_and_the_lines_still_reach_combined_log(tmp_path):
    router, run = _router(tmp_path)
    run.task_log("worker-0").symlink_to(tmp_path / "elsewhere")  # planted: never followed
    router.write("worker:0", b"one\n")
    router.write("worker:0", b"two\n")
    router.close()
    assert not (tmp_path / "elsewhere").exists()
    assert router.guard.failure is not None and "worker-0.log" in router.guard.failure
    assert run.combined_log.read_bytes().count(b"[worker:0") == 2


def _capped(tmp_path: Path, tasks: int, cap: int) -> tuple[LogRouter, RunDir]:
    """A router of ``tasks`` tasks that keeps at most ``cap`` of their files open."""
    run = RunDir(tmp_path / "run")
    (tmp_path / "run" / "logs").mkdir(parents=True)
    router = LogRouter(run, out=io.BytesIO(), color=False)
    router.open_logs = cap
    router.open_attempt(0, [(f"worker:{i}", f"worker-{i}", f"h{i}") for i in range(tasks)])
    return router, run


def test_past_the_open_files_cap_the_least_recently_written_file_closes_and_no_line_is_lost(tmp_path):
    """At most ``open_logs`` tasks' files open at once (a 16,384-task launcher ran out of descriptors
    under a 20,000 limit): the least recently written is flushed and closed, and its next line opens it
    again, appending, in order."""
    router, run = _capped(tmp_path, tasks=7, cap=3)
    for rnd in range(4):
        for i in range(6):  # worker:6 says nothing
            router.write(f"worker:{i}", f"round {rnd} of {i}\n".encode())
            assert len(router.files) <= 3
    router.flush()
    assert sorted(router.files) == ["worker:3", "worker:4", "worker:5"]  # the last three opened
    assert run.task_log("worker-0").read_bytes() == b"".join(f"round {r} of 0\n".encode() for r in range(4))
    router.close()
    for i in range(6):
        assert run.task_log(f"worker-{i}").read_bytes() == b"".join(f"round {r} of {i}\n".encode() for r in range(4))
    assert run.task_log("worker-6").read_bytes() == b""  # a silent task's file, made at the end
    assert router.lines_written == {f"worker:{i}": (4 if i < 6 else 0) for i in range(7)}
    assert router.guard.failure is None


def test_a_task_that_writes_often_keeps_its_file_open_past_the_cap(tmp_path):
    """The least recently written file closes first: a chatty chief among quiet workers is not closed
    and opened again at every other task's line."""
    router, run = _capped(tmp_path, tasks=6, cap=2)
    router.write("worker:0", b"start\n")
    chief = router.files["worker:0"]
    for rnd in range(3):
        for i in range(1, 6):
            router.write("worker:0", f"chief {rnd} {i}\n".encode())
            router.write(f"worker:{i}", f"quiet {rnd}\n".encode())
            assert router.files.get("worker:0") is chief  # never closed for room
    router.close()
    assert run.task_log("worker-0").read_bytes().count(b"\n") == 1 + 15
    assert all(run.task_log(f"worker-{i}").read_bytes().count(b"\n") == 3 for i in range(1, 6))


def test_a_file_that_failed_is_not_opened_again_after_it_was_closed_for_room(tmp_path):
    router, run = _router(tmp_path)
    router.open_logs = 1
    run.task_log("worker-0").symlink_to(tmp_path / "elsewhere")  # planted: never followed
    router.write("worker:0", b"one\n")
    router.write("worker:1", b"a\n")  # closes worker:0's (failed) file for room
    router.guard.failure = None
    router.write("worker:0", b"two\n")  # not tried again: no second warning, nothing followed
    router.close()
    assert router.guard.failure is None and not (tmp_path / "elsewhere").exists()
    assert run.task_log("worker-1").read_bytes() == b"a\n"
    assert run.combined_log.read_bytes().count(b"[worker:0") == 2


def test_every_tasks_log_and_event_file_stay_open_where_the_open_file_limit_has_room_for_them():
    """Below the limit nothing is closed for room (at 4,096 tasks a cap of 1,024 logs opened and closed a
    file for every line, one of 512 event files for most points); past it the logs get the room first,
    never fewer than the floors ``needed`` counts, never more than the tasks (and the job's own run)."""
    assert limits.open_files(4096, per_task=1, soft=20_000) == (4096, 4097)
    assert limits.open_files(4096, per_task=1, soft=resource.RLIM_INFINITY) == (4096, 4097)
    assert limits.open_files(4096, per_task=3, soft=20_000) == (4096, 20_000 - 64 - 1024 - 3 * 4096 - 4096)
    assert limits.open_files(16_384, per_task=1, soft=20_000) == (20_000 - 64 - 1024 - 16_384 - 512, 512)
    assert limits.open_files(16_384, per_task=3, soft=20_000) == (limits.OPEN_LOGS, limits.OPEN_EVENT_FILES)
    assert limits.open_files(3, per_task=3, soft=1024) == (3, 4)
    for tasks, per_task, soft in [(16_384, 1, 20_000), (4096, 3, 20_000), (9000, 2, 30_000), (100, 3, 5000)]:
        logs, events = limits.open_files(tasks, per_task, soft)
        floors = min(tasks, limits.OPEN_LOGS) + min(tasks + 1, limits.OPEN_EVENT_FILES)
        # what needed() counts for the floors, the rest of the room past them: never past the limit
        assert limits.needed(tasks, per_task) - floors + logs + events <= max(soft, limits.needed(tasks, per_task))


@pytest.mark.parametrize("seed", range(3))
def test_a_lines_time_stamp_is_the_text_datetime_gives(seed):
    """``logline.iso`` keeps the second's text between lines: the same text as formatting the whole time,
    including a fraction that rounds up into the next second."""
    rng = random.Random(seed)
    times = [rng.uniform(-2e9, 4e9) for _ in range(20_000)] + [rng.uniform(1.8e9, 1.8e9 + 3) for _ in range(5_000)]
    times += [1_795_883_174.9999995, 1_795_883_174 + 0.0014995, 0.0, -0.0000004, -1.9999995]
    for ts in times:
        assert logline.iso(ts) == datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z", ts
