"""TensorBoard scalars of what tfcluster measures: records -> points (pure), event files read back with
TensorBoard's own reader (``EventAccumulator``), private files, no TensorFlow in the launcher, and a real
3-worker run on the test bed: RUN/tensorboard (and ``--tensorboard DIR``) beside the user's curves."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PY, REPO
from shared_runs import KERAS_EPOCHS, KERAS_STEPS_PER_EPOCH

from orchestrator.sinks.tensorboard import EventFiles, Point, Scalars, TensorBoardSink, run_name

T0 = 1_800_000_000.0


def accumulate(path: Path):
    """TensorBoard's own reader over one run directory (every scalar kept)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    acc.Reload()
    return acc


def scalars(acc, tag: str) -> list[tuple[int, float, float]]:
    return [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]


def beat(task_steps: int, ts: float, attempt: int = 0, examples: int | None = None, **extra) -> dict:
    prog = {"steps": task_steps, "examples": examples, "step_time_s": 0.05, "phase": "train", "ts": ts}
    return {"ts": ts, "seq": int(ts), "attempt": attempt, "cpu_pct": 150.0, "rss_mb": 700.5, "progress": prog, **extra}


def test_records_become_points_keyed_by_step_and_wall_time():
    sc = Scalars(min_interval_s=1.0)
    gpus = [{"index": 0, "util": 97.0, "sm_clock_mhz": 1410, "power_w": 301.5, "temp_c": 71.0, "mem_used_mb": 30000}]
    host = {"wait_pct": 12.5, "throttled_pct": 3.0}
    assert sc.record("worker:0", beat(10, T0, examples=640, gpus=gpus, host=host))[0].values["gpu/0/power_w"] == 301.5
    assert sc.record("worker:0", beat(15, T0 + 0.5, examples=960)) == []  # within min_interval_s: fed, not written
    # the task's rates and loss: the supervisor's own figures, as its last status snapshot showed them
    live = {"steps_per_s": 10.0, "examples_per_s": 640.0, "loss": 0.25, "state": "running"}
    assert [p.run for p in sc.status({"updated": T0 + 1.5, "tasks": {"worker:0": live}})] == ["job"]
    (p,) = sc.record("worker:0", beat(30, T0 + 2.0, examples=1920))
    assert p.run == "worker-0" and p.step == 30 and p.wall == T0 + 2.0
    assert p.values["throughput/steps_per_s"] == 10.0 and p.values["throughput/examples_per_s"] == 640.0
    assert p.values["train/loss"] == 0.25
    assert p.values["host/cpu_pct"] == 150.0 and p.values["host/rss_mb"] == 700.5 and p.values["step/time_ms"] == 50.0
    (w,) = sc.record(
        "worker:0",
        {
            "kind": "profile",
            "ts": T0 + 2.5,
            "attempt": 0,
            "steps": 20,
            "step_ms": 50.0,
            "input_ms": 5.0,
            "compute_ms": 20.0,
            "collective_ms": 25.0,
            "pre_collective_ms": 25.0,
        },
    )
    assert w.step == 30 and w.values == {
        "step_split/step_ms": 50.0,
        "step_split/input_ms": 5.0,
        "step_split/compute_ms": 20.0,
        "step_split/collective_ms": 25.0,
        "step_split/own_work_ms": 25.0,
    }
    # a second window within min_interval_s: counted, not written (one step split per task per interval)
    assert sc.record("worker:0", {"kind": "profile", "ts": T0 + 3.0, "attempt": 0, "steps": 20, "step_ms": 9.0}) == []
    # a restart: the next attempt counts from 0 again, the curve goes on from 30
    (r,) = sc.record("worker:0", beat(4, T0 + 10.0, attempt=1))
    assert r.step == 34
    # scores: written when a round changes them; the job's rates every status
    status = {
        "updated": T0 + 11,
        "throughput": {"steps_per_s": 9.5, "examples_per_s": 608.0},
        "tasks": {"worker:0": {"state": "running", "relative_score": 0.5, "individual_score": 0.9, "straggler": True}},
    }
    task, job = sc.status(status)
    assert task.run == "worker-0" and task.step == 34
    assert task.values == {"straggler/named": 1.0, "straggler/relative_score": 0.5, "straggler/individual_score": 0.9}
    assert (
        job.run == "job"
        and job.step == 34
        and job.values["throughput/examples_per_s"] == 608.0
        and job.values["tasks/running"] == 1
    )
    assert [p.run for p in sc.status(status)] == ["job"]  # the same scores are not written again


def test_bad_numbers_never_become_scalars():
    sc = Scalars()
    assert (
        sc.record(
            "worker:1", {"ts": T0, "cpu_pct": float("nan"), "rss_mb": 10**400, "gpus": [{"index": "x"}], "host": "?"}
        )
        == []
    )
    assert sc.record("worker:2", {"ts": T0, "cpu_pct": 5, "gpus": 7, "progress": "?"})[0].values == {
        "host/cpu_pct": 5.0
    }
    assert run_name("chief:0") == "chief-0"


def test_event_files_read_back_with_tensorboards_reader_and_are_private(tmp_path):
    root = tmp_path / "tb"
    files = EventFiles(root)
    for k in range(5):
        files.add(Point("worker-0", 10 * k, T0 + k, {"throughput/examples_per_s": 640.0 + k, "host/cpu_pct": 99.0}))
    files.add(Point("job", 40, T0 + 5, {"goodput/goodput_pct": 61.5}))
    files.close()
    acc = accumulate(root / "worker-0")
    assert set(acc.Tags()["scalars"]) == {"throughput/examples_per_s", "host/cpu_pct"}
    assert scalars(acc, "throughput/examples_per_s") == [(10 * k, T0 + k, pytest.approx(640.0 + k)) for k in range(5)]
    assert scalars(accumulate(root / "job"), "goodput/goodput_pct")[0][2] == pytest.approx(61.5)
    for d in (root, root / "worker-0", root / "job"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for f in root.rglob("events.out.tfevents.*"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_past_the_open_files_cap_a_run_appends_to_its_own_file_and_tensorboard_reads_every_point(tmp_path):
    """At most ``open_files`` event files open (one run per task: 16,384 of them took a launcher past its
    open-file limit): the file opened longest ago closes, and its run's next point appends to the same
    file, which TensorBoard's reader reads whole, in order."""
    root = tmp_path / "tb"
    files = EventFiles(root, open_files=2)
    for k in range(4):
        for w in range(5):
            files.add(Point(f"worker-{w}", 10 * k, T0 + k, {"host/cpu_pct": float(100 * w + k)}))
            assert len(files._open) <= 2
        files.flush()
    files.close()
    for w in range(5):
        made = list((root / f"worker-{w}").iterdir())
        assert len(made) == 1 and stat.S_IMODE(made[0].stat().st_mode) == 0o600, made
        got = scalars(accumulate(root / f"worker-{w}"), "host/cpu_pct")
        assert got == [(10 * k, T0 + k, pytest.approx(100.0 * w + k)) for k in range(4)], (w, got)
    # the least recently written closes first: the job's run, written between every two points, stays open
    lru = EventFiles(tmp_path / "lru", open_files=2)
    lru.add(Point("job", 0, T0, {"throughput/steps_per_s": 1.0}))
    job = lru._open["job"]
    for w in range(5):
        lru.add(Point(f"worker-{w}", 1, T0, {"host/cpu_pct": 1.0}))
        lru.add(Point("job", w + 1, T0, {"throughput/steps_per_s": 1.0}))
        assert lru._open.get("job") is job
    lru.close()


def test_a_link_planted_in_place_of_a_closed_event_file_is_refused_not_followed(tmp_path):
    """A file closed for room is reopened without following links: one planted at its path between two
    sittings fails that run alone (its points go nowhere, the reason kept), the link's target is
    untouched, and the other runs are written on."""
    root, target = tmp_path / "tb", tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    files = EventFiles(root, open_files=1)
    files.add(Point("worker-0", 1, T0, {"host/cpu_pct": 1.0}))
    files.add(Point("worker-1", 1, T0, {"host/cpu_pct": 1.0}))  # worker-0's file closed for room
    (made,) = (root / "worker-0").iterdir()
    made.unlink()
    made.symlink_to(target)
    files.add(Point("worker-0", 2, T0 + 1, {"host/cpu_pct": 2.0}))
    files.add(Point("worker-0", 3, T0 + 2, {"host/cpu_pct": 3.0}))  # not tried again
    files.add(Point("worker-1", 2, T0 + 1, {"host/cpu_pct": 5.0}))
    files.close()
    assert target.read_bytes() == b"theirs"
    assert list(files.failed) == ["worker-0"] and "worker-0" in files.failed["worker-0"]
    assert [s for s, _, _ in scalars(accumulate(root / "worker-1"), "host/cpu_pct")] == [1, 2]


def test_a_run_directory_swapped_for_a_link_between_two_sittings_is_refused_not_followed(tmp_path):
    """The file's directory is opened with ``O_NOFOLLOW`` too: a run directory replaced by a link to
    elsewhere after its file was closed for room fails that run; nothing is written through the link."""
    root, elsewhere = tmp_path / "tb", tmp_path / "elsewhere"
    elsewhere.mkdir()
    files = EventFiles(root, open_files=1)
    files.add(Point("worker-0", 1, T0, {"host/cpu_pct": 1.0}))
    files.add(Point("worker-1", 1, T0, {"host/cpu_pct": 1.0}))  # worker-0's file closed for room
    (made,) = (root / "worker-0").iterdir()
    (root / "worker-0").rename(tmp_path / "moved")
    (elsewhere / made.name).write_bytes(b"")  # what a reopen through the link would append to
    (root / "worker-0").symlink_to(elsewhere)
    files.add(Point("worker-0", 2, T0 + 1, {"host/cpu_pct": 2.0}))
    files.close()
    assert (elsewhere / made.name).read_bytes() == b"" and list(files.failed) == ["worker-0"]


def test_an_event_file_deleted_between_two_sittings_is_made_again_and_the_writer_goes_on(tmp_path):
    """Someone cleans the TensorBoard directory mid-run: the run's next point starts a new file (with
    its version record, so TensorBoard reads it), the other runs are not stopped, nothing is failed."""
    root = tmp_path / "tb"
    files = EventFiles(root, open_files=1)
    files.add(Point("worker-0", 1, T0, {"host/cpu_pct": 1.0}))
    files.add(Point("worker-1", 1, T0, {"host/cpu_pct": 1.0}))  # worker-0's file closed for room
    for made in (root / "worker-0").iterdir():
        made.unlink()
    files.add(Point("worker-0", 2, T0 + 1, {"host/cpu_pct": 2.0}))
    files.add(Point("worker-1", 2, T0 + 1, {"host/cpu_pct": 5.0}))
    files.close()
    assert files.failed == {}
    assert scalars(accumulate(root / "worker-0"), "host/cpu_pct") == [(2, T0 + 1, pytest.approx(2.0))]
    assert [s for s, _, _ in scalars(accumulate(root / "worker-1"), "host/cpu_pct")] == [1, 2]


def test_a_second_writer_of_the_same_second_takes_its_own_file(tmp_path):
    """A requeued run's writer (same run directory, same suffix, same second) never truncates nor
    appends to the first one's file."""
    root = tmp_path / "tb"
    first, second = EventFiles(root), EventFiles(root)
    first.add(Point("job", 1, T0, {"goodput/goodput_pct": 50.0}))
    second.add(Point("job", 2, T0 + 1, {"goodput/goodput_pct": 60.0}))
    first.close()
    second.close()
    assert len(list((root / "job").iterdir())) == 2
    got = sorted(scalars(accumulate(root / "job"), "goodput/goodput_pct"))
    assert got == [(1, T0, pytest.approx(50.0)), (2, T0 + 1, pytest.approx(60.0))]


def test_a_flush_makes_the_points_written_since_readable_before_close(tmp_path):
    """Without tensorboardX's fsync of every file: the files written since the last flush reach the
    kernel, where TensorBoard reads them while the job runs."""
    root = tmp_path / "tb"
    files = EventFiles(root)
    files.add(Point("worker-0", 1, T0, {"host/cpu_pct": 10.0}))
    files.add(Point("worker-1", 1, T0, {"host/cpu_pct": 20.0}))
    files.flush()
    files.add(Point("worker-1", 2, T0 + 1, {"host/cpu_pct": 21.0}))
    files.flush()  # only worker-1's file has anything new
    assert scalars(accumulate(root / "worker-1"), "host/cpu_pct") == [
        (1, T0, pytest.approx(20.0)),
        (2, T0 + 1, pytest.approx(21.0)),
    ]
    assert [v for _, _, v in scalars(accumulate(root / "worker-0"), "host/cpu_pct")] == [pytest.approx(10.0)]
    files.close()


def test_the_sink_only_queues_and_writes_from_its_thread(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb", ["worker:0", "worker:1"], flush_s=0.05)
    for k in range(30):
        for i in range(2):
            sink.write(f"worker:{i}", beat(10 * k, T0 + k, examples=640 * k))
        live = {f"worker:{i}": {"state": "running", "steps_per_s": 10.0, "examples_per_s": 640.0} for i in range(2)}
        sink.update({"updated": T0 + k, "throughput": {"steps_per_s": 10.0, "examples_per_s": 640.0}, "tasks": live})
    sink.close()
    assert sink.problems == [] and sink.dropped == 0
    acc = accumulate(tmp_path / "tb" / "worker-1")
    got = scalars(acc, "throughput/examples_per_s")
    assert len(got) >= 25 and all(v == pytest.approx(640.0) for _, _, v in got)
    assert [s for s, _, _ in scalars(accumulate(tmp_path / "tb" / "job"), "throughput/steps_per_s")][-1] == 290


def test_a_run_whose_directory_was_planted_with_a_link_is_one_problem_at_close_and_the_rest_are_written(tmp_path):
    """The live sink: worker-1's directory is a link planted before its first point (never followed,
    as ``private_dirs`` refuses it or its file refuses it); the job and worker-0 are written, and the close
    names what was not."""
    root, elsewhere = tmp_path / "tb", tmp_path / "elsewhere"
    elsewhere.mkdir()
    root.mkdir(mode=0o700)
    (root / "worker-1").symlink_to(elsewhere)
    sink = TensorBoardSink(root, ["worker:0", "worker:1"], flush_s=0.05)
    for k in range(1, 4):
        for i in range(2):
            sink.write(f"worker:{i}", beat(10 * k, T0 + k, examples=640 * k))
        live = {f"worker:{i}": {"state": "running", "steps_per_s": 10.0, "examples_per_s": 640.0} for i in range(2)}
        sink.update({"updated": T0 + k, "throughput": {"steps_per_s": 10.0, "examples_per_s": 640.0}, "tasks": live})
    sink.close()
    assert list(elsewhere.iterdir()) == []
    assert len(sink.problems) == 1 and "1 run not written" in sink.problems[0] and "worker-1" in sink.problems[0]
    assert scalars(accumulate(root / "worker-0"), "host/cpu_pct") or scalars(
        accumulate(root / "worker-0"), "throughput/examples_per_s"
    )
    assert scalars(accumulate(root / "job"), "throughput/steps_per_s")


def test_a_continued_run_goes_on_from_the_steps_written_before(tmp_path):
    """A requeued Slurm run's next supervisor: its curves go on from the earlier allocation's steps."""
    history = tmp_path / "heartbeats.jsonl"
    history.write_text("".join(json.dumps({**beat(100, T0 + k), "task": "worker:0"}) + "\n" for k in range(3)))
    sink = TensorBoardSink(tmp_path / "tb", ["worker:0"], history=history)
    sink.write("worker:0", beat(5, T0 + 100, attempt=1))
    sink.close()
    assert [s for s, _, _ in scalars(accumulate(tmp_path / "tb" / "worker-0"), "host/cpu_pct")] == [105]


LAUNCHER_SCRIPT = """
import json, sys, time
from pathlib import Path
from orchestrator.sinks.tensorboard import TensorBoardSink
mods = lambda: sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorboard', 'tensorboardX'))
idle = TensorBoardSink(Path(sys.argv[1]) / 'idle', ['worker:0'])
idle.write('worker:0', {'ts': time.time(), 'cpu_pct': 1.0})
idle.close()
before = mods()
s = TensorBoardSink(Path(sys.argv[1]) / 'trained', ['worker:0'])
s.write('worker:0', {'ts': time.time() - 2, 'cpu_pct': 1.0})
s.write('worker:0', {'ts': time.time(), 'cpu_pct': 2.0, 'progress': {'steps': 5, 'phase': 'train'}})
s.close()
assert not s.problems and not idle.problems, (s.problems, idle.problems)
loaded, boto3_loaded = mods(), 'boto3' in sys.modules
try:
    import boto3
    later = boto3.__name__
except ImportError:
    later = None
print(json.dumps({"before": before, "loaded": loaded, "boto3_loaded": boto3_loaded, "boto3_later": later}))
"""


@pytest.fixture(scope="module")
def launcher_process(tmp_path_factory):
    """One launcher-like process (a fresh interpreter: what it imports is the point) that writes events
    through the sink, idle and then trained: (its findings, its TensorBoard directory). Shared by the
    tests below, which each judge one fact of it (it used to be started once per test)."""
    root = tmp_path_factory.mktemp("tb")
    res = subprocess.run(
        [sys.executable, "-c", LAUNCHER_SCRIPT, str(root)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), root


def test_the_launcher_writes_events_without_tensorflow(launcher_process):
    """tensorboardX, never TensorFlow; and only once training began: a job that trained nothing writes
    no files and imports nothing (its startup points are held, then written with the first step's)."""
    got, root = launcher_process
    assert got["before"] == [] and not (root / "idle" / "worker-0").exists()
    loaded = got["loaded"]
    assert "tensorboardX" in loaded and not any(
        m.startswith(("tensorflow", "tensorboard.")) or m == "tensorboard" for m in loaded
    )
    (events,) = (root / "trained" / "worker-0").glob("events.out.tfevents.*")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    assert [e.value for e in acc.Scalars("host/cpu_pct")] == [1.0, 2.0]  # the startup point too


def test_tensorboardx_is_imported_without_its_cloud_clients(launcher_process):
    """The launcher writes local files: boto3 (S3 paths, most of tensorboardX's import CPU) is not
    imported with it, and is not left marked absent either: a later ``import boto3`` gets the module."""
    pytest.importorskip("boto3")
    got, root = launcher_process
    assert "tensorboardX" in got["loaded"] and not got["boto3_loaded"] and got["boto3_later"] == "boto3"
    assert list((root / "trained" / "worker-0").glob("events.out.tfevents.*"))


@pytest.mark.e2e
def test_a_real_run_writes_tensorboard_scalars_beside_the_users(keras_scraped_run):
    """3 workers of keras_synthetic (``shared_runs.keras_scraped_run``, the run test_metrics scrapes):
    every worker's step split, rates, scores, CPU and RSS, the job's rates and goodput; and with
    --tensorboard DIR, under DIR/tfcluster/<run id> beside the user's runs."""
    res, own = keras_scraped_run.launched, keras_scraped_run.tensorboard
    run_dir = res.run_dir
    assert res.rc == 0, res.stderr[-3000:]
    made = KERAS_EPOCHS * KERAS_STEPS_PER_EPOCH
    started = next(e["ts"] for e in res.events if e["event"] == "job_started")
    launcher = json.loads((run_dir / "launcher.json").read_text())
    run_id = json.loads((run_dir / "plan.json").read_text())["run_id"]
    root = own / "tfcluster" / run_id
    assert launcher["tensorboard_dir"] == str(root)
    assert not (run_dir / "tensorboard").exists() and sorted(p.name for p in own.iterdir()) == ["tfcluster", "train"]
    for i in range(3):
        acc = accumulate(root / f"worker-{i}")
        tags = set(acc.Tags()["scalars"])
        need = {
            "step_split/step_ms",
            "step_split/input_ms",
            "step_split/compute_ms",
            "step_split/collective_ms",
            "step_split/own_work_ms",
            "throughput/steps_per_s",
            "throughput/examples_per_s",
            "host/cpu_pct",
            "host/rss_mb",
            "straggler/relative_score",
            "straggler/individual_score",
            "train/loss",  # Keras fit's batch logs, through the progress records
        }
        assert need <= tags, need - tags
        steps = [s for s, _, _ in scalars(acc, "host/cpu_pct")]
        assert steps == sorted(steps) and steps[-1] >= made - 40  # keyed by training step
        walls = [w for _, w, _ in scalars(acc, "host/cpu_pct")]
        assert walls == sorted(walls) and started < walls[0] < walls[-1]  # and by wall time, of this run
        ex = scalars(acc, "throughput/examples_per_s")
        assert ex and max(v for _, _, v in ex) > 0
    job = accumulate(root / "job")
    gp = scalars(job, "goodput/goodput_pct")
    assert len(gp) == 1 and 0 < gp[0][2] < 100
    report = json.loads(
        subprocess.run(
            [PY, "-m", "orchestrator", "report", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        ).stdout
    )
    assert gp[0][2] == pytest.approx(report["goodput"]["goodput"] * 100, abs=0.01)  # the goodput report shows
    assert {"throughput/examples_per_s", "tasks/running", "run/examples_per_s"} <= set(job.Tags()["scalars"])
    for d in [root, *root.iterdir()]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in root.rglob("events.out.tfevents.*"))
    assert os.stat(own / "train").st_mode  # untouched (the fixture saw no job process left on a host)
