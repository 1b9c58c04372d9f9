"""Straggler signals: the trace summary, the sampler's failure handling, a real profiled fit, and the
3-worker experiment showing that pre_collective_ms / input_ms single out an input-bound straggler."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from worker_entry import profiling
from worker_entry.profiling import Event, ProfileSampler, summarize

ROOT = Path(__file__).resolve().parents[1]
MS = 1e6  # ns


def _step_events(start_ms: float, *, pre: float, coll: float, inp: float, dur: float, enter: bool = True):
    t = start_ms * MS
    evs = [
        Event("EagerLocalExecute: __inference_train_function_12", "python", t, dur * MS),
        Event("IteratorGetNextOp::DoCompute", "tf_data_iterator_get_next/1", t + 0.1 * MS, inp * MS),
        Event(
            "CollectiveReduceV2",
            "collective_ops/7",
            t + (pre + 0.2) * MS,
            coll * MS,
            "CollectiveReduceV2:CollectiveReduceV2",
        ),
        # a second collective of the same step (e.g. a metric), later
        Event(
            "CollectiveReduceV2",
            "collective_ops/7",
            t + (pre + coll + 0.5) * MS,
            1 * MS,
            "div_no_nan/CollectiveReduceV2:CollectiveReduceV2",
        ),
        # not a collective op event even though the name starts like one
        Event("CollectiveExecutor::RunClosure", "collective_ops/7", t + pre * MS, 0.3 * MS),
    ]
    if enter:
        evs.append(Event(profiling.COLLECTIVE_ENTER, "tf_Compute/3", t + pre * MS, 0.4 * MS))
    return evs


def test_summarize_per_step_means():
    events = [
        *_step_events(0, pre=10, coll=4, inp=8, dur=20),
        *_step_events(25, pre=20, coll=2, inp=16, dur=30),
        # a shorter helper function on the Python thread is not the step function
        Event("EagerLocalExecute: __inference_helper_3", "python", 60 * MS, 1 * MS),
        # events outside any step (between steps, or after the window) are ignored
        Event("CollectiveReduceV2", "collective_ops/7", 21 * MS, 3 * MS, "CollectiveReduceV2:CollectiveReduceV2"),
        Event("IteratorGetNextOp::DoCompute", "x", 70 * MS, 50 * MS),
    ]
    s = summarize(events)
    assert s is not None
    assert s.step_function == "__inference_train_function_12"
    assert s.steps == 2
    assert s.step_ms == pytest.approx(25.0)
    assert s.pre_collective_ms == pytest.approx(15.0)  # (10 + 20) / 2, from the kernel-entry marker
    assert s.per_step_pre_collective_ms == pytest.approx([10.0, 20.0])
    assert s.collective_ms == pytest.approx((4 + 1 + 2 + 1) / 2)
    assert s.input_ms == pytest.approx((8 + 16) / 2)


def test_summarize_falls_back_to_first_collective_op_and_handles_empty():
    s = summarize(_step_events(0, pre=5, coll=1, inp=0, dur=10, enter=False))
    assert s is not None and s.pre_collective_ms == pytest.approx(5.2)
    assert summarize([Event("train", "python", 0, 1)]) is None
    # a single-worker step without collectives: no pre-collective time, not zero
    s = summarize([Event("EagerLocalExecute: __inference_f_1", "python", 0, 2 * MS)])
    assert s is not None and s.pre_collective_ms is None and s.collective_ms == 0


def test_events_from_xspace_names_and_times():
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = {1: "EagerLocalExecute: __inference_train_function_9", 2: "CollectiveOpV2Kernel::Run"}
    names |= {3: "CollectiveReduceV2:CollectiveReduceV2", 4: "IteratorGetNextOp::DoCompute"}
    for mid, name in names.items():
        plane.event_metadata[mid].id = mid
        plane.event_metadata[mid].name = name
    py = plane.lines.add(name="python", timestamp_ns=1000)
    py.events.add(metadata_id=1, offset_ps=0, duration_ps=10 * 10**9)
    worker = plane.lines.add(name="tf_Compute/1", timestamp_ns=1000)
    worker.events.add(metadata_id=4, offset_ps=10**9, duration_ps=2 * 10**9)
    worker.events.add(metadata_id=2, offset_ps=4 * 10**9, duration_ps=10**8)
    worker.events.add(metadata_id=3, offset_ps=5 * 10**9, duration_ps=3 * 10**9)
    space.planes.add(name="/device:GPU:0").lines.add(name="ignored")
    events = profiling.events_from_xspace(space.SerializeToString())
    assert [(e.name, e.thread) for e in events][1:] == [
        ("IteratorGetNextOp::DoCompute", "tf_Compute/1"),
        ("CollectiveOpV2Kernel::Run", "tf_Compute/1"),
        ("CollectiveReduceV2", "tf_Compute/1"),
    ]
    assert events[3].long_name == "CollectiveReduceV2:CollectiveReduceV2"
    assert events[1].start_ns == 1000 + 10**6 and events[1].dur_ns == 2 * 10**6  # ps offsets -> ns
    s = summarize(events)
    assert s is not None and s.steps == 1
    assert (s.pre_collective_ms, s.input_ms, s.collective_ms) == pytest.approx((4.0, 2.0, 3.0))


class _FailingSession:
    def __init__(self, in_memory: bool = True) -> None:
        raise RuntimeError("profiler exploded")


def test_sampler_failure_warns_once_and_disables(monkeypatch, capsys):
    monkeypatch.setattr(profiling, "_Session", _FailingSession)
    emitted = []
    sampler = ProfileSampler(1.0, first_delay_s=0, emit=lambda kind, **kw: emitted.append(kw))
    for _ in range(30):
        sampler.on_batch_begin()  # must never raise into the training loop
        sampler.on_batch_end()
    assert sampler.enabled is False and emitted == []
    err = capsys.readouterr().err
    assert err.count("profiler sampling disabled") == 1 and "profiler exploded" in err


def test_sampler_off_by_default():
    assert profiling.interval_from_env({}) == 0
    assert profiling.interval_from_env({"TFCLUSTER_PROFILE_INTERVAL_S": "0"}) == 0
    assert profiling.interval_from_env({"TFCLUSTER_PROFILE_INTERVAL_S": "junk"}) == 0
    assert profiling.interval_from_env({"TFCLUSTER_PROFILE_INTERVAL_S": "2.5"}) == 2.5
    assert ProfileSampler.from_env({}).enabled is False


def _run(argv, env, timeout=180):
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def test_sampler_on_a_real_fit_in_memory_and_xspace(tmp_path):
    """One worker, no collectives: both result paths produce a record; the temp logdir is removed.
    Runs in a child process: profiling must not put the test process at risk."""
    script = textwrap.dedent(
        """
        import json, os, numpy as np, tensorflow as tf
        from worker_entry.profiling import ProfileSampler
        out = {}
        class Drive(tf.keras.callbacks.Callback):
            def __init__(self, sampler): super().__init__(); self.s = sampler
            def on_train_batch_begin(self, b, logs=None): self.s.on_batch_begin()
            def on_train_batch_end(self, b, logs=None): self.s.on_batch_end()
        model = tf.keras.Sequential([tf.keras.layers.Input((10,)), tf.keras.layers.Dense(32), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        ds = tf.data.Dataset.from_tensor_slices((np.ones((640, 10), "f4"), np.ones((640, 1), "f4"))).batch(64).repeat()
        for mode in (True, False):
            got = []
            s = ProfileSampler(0.05, window_steps=10, in_memory=mode, first_delay_s=0,
                               emit=lambda kind, **kw: got.append(dict(kind=kind, **kw)))
            model.fit(ds, epochs=1, steps_per_epoch=100, callbacks=[Drive(s)], verbose=0)
            s.close()
            out["memory" if mode else "xspace"] = {"records": got, "cost": s.last_cost, "windows": s.windows}
        out["leftover"] = [n for n in os.listdir(os.environ["TMPDIR"]) if n.startswith("tfcluster-prof-")]
        print("RESULT " + json.dumps(out))
        """
    )
    env = dict(
        os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT)
    )
    for _ in range(2):  # a signal death is TF's profiler crash (see profiling.py): try once more
        rc, out = _run([sys.executable, "-c", script], env)
        if rc >= 0:
            break
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert rc == 0 and lines, out[-3000:]
    result = json.loads(lines[0][7:])
    for mode in ("memory", "xspace"):
        r = result[mode]
        assert r["windows"] >= 2 and len(r["records"]) >= 1, r
        rec = r["records"][0]
        assert rec["kind"] == "profile" and rec["steps"] == 10
        assert rec["step_ms"] > 0 and rec["cpu_ms"] > 0
        assert rec["collective_ms"] == 0 and rec["pre_collective_ms"] is None  # one worker: no all-reduce
        assert rec["input_ms"] > 0  # IteratorGetNextOp::DoCompute found in both formats
    assert result["leftover"] == []


# ------------------------------------------------------------------------------ the experiment


def run_experiment(slow_ms: float, steps: int, num_workers: int = 3, interval_s: float = 1.5):
    """Run the demo on ``num_workers`` local MWMS workers (worker:1 slowed by ``slow_ms`` per batch in
    its tf.data pipeline) under the instrumentation; return each worker's profile records."""
    from worker_entry.examples.local_cluster import run_local_cluster

    env = dict(
        os.environ,
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([str(ROOT / "worker_entry" / "_site"), str(ROOT)]),
        TFCLUSTER_INSTRUMENT="1",
        TFCLUSTER_PROFILE_INTERVAL_S=str(interval_s),
        # if TF's profiler crash kills a worker, the others fail fast instead of waiting forever
        TFCLUSTER_COLLECTIVE_TIMEOUT_S="15",
        TFCLUSTER_HEARTBEAT_TIMEOUT_S="3",
    )
    argv = [sys.executable, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "1"]
    argv += ["--steps-per-epoch", str(steps), "--slow-input-ms", str(slow_ms), "--slow-task", "worker:1"]
    return run_local_cluster(argv, num_workers, env=env, timeout_s=90, cwd=str(ROOT))


def _median(records, key):
    return statistics.median(r[key] for r in records if r[key] is not None)


def _profiles_per_worker(slow_ms: float, steps: int, num_workers: int = 3, attempts: int = 3):
    """Profile records per worker from the first run in which no worker died.

    TF 2.21 can crash inside ProfilerSession.stop() (see profiling.py); in this experiment a large share
    of runs lose a worker to SIGSEGV/SIGABRT. Samples of such a run are disturbed by the dying peer, so
    only clean runs count; any failure that is not a signal death fails the test at once.
    """
    crashes = 0
    for _ in range(attempts):
        results = run_experiment(slow_ms, steps, num_workers)
        if any((r.returncode or 0) < 0 for r in results):
            crashes += 1
            continue
        for r in results:
            assert r.returncode == 0, r.output[-3000:]
            assert len(r.of_kind("profile")) >= 2, (r.records, r.output[-2000:])
        return [r.of_kind("profile") for r in results], crashes
    pytest.skip(f"TensorFlow's profiler crashed a worker in all {attempts} runs (TF 2.21 bug, see profiling.py)")


@pytest.mark.e2e
def test_straggler_is_separated_and_homogeneous_run_is_flat():
    # prefetch hides up to one natural step (~20-30 ms with 3 workers on 2 cores) of input slowness:
    # a 60 ms sleep leaves the straggler clearly input-bound on a loaded machine too.
    slow, slow_crashes = _profiles_per_worker(60, steps=100)  # ~60 ms per step
    flat, flat_crashes = _profiles_per_worker(0, steps=300)  # ~20 ms per step
    keys = ("pre_collective_ms", "input_ms", "collective_ms", "step_ms", "cpu_ms")
    report = {
        name: {k: [round(_median(w, k), 2) for w in workers] for k in keys}
        for name, workers in (("slow worker:1", slow), ("homogeneous", flat))
    }
    report["runs lost to the TF profiler crash"] = slow_crashes + flat_crashes
    print(json.dumps(report))
    pre = [_median(w, "pre_collective_ms") for w in slow]
    inp = [_median(w, "input_ms") for w in slow]
    assert pre[1] > 3 * max(pre[0], pre[2]) and pre[1] > 8, report
    assert inp[1] > 5 * max(inp[0], inp[2], 0.5), report
    flat_pre = [_median(w, "pre_collective_ms") for w in flat]
    assert max(flat_pre) < 6 and max(flat_pre) < 3 * max(min(flat_pre), 1.0), report
    assert max(_median(w, "input_ms") for w in flat) < 3, report
