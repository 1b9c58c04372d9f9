"""The step clock: pairing stamps with steps, the window, the in-graph stamps in real tf_keras fits
(MirroredStrategy in one process), failure handling, and a 3-worker compute-bound straggler."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from worker_entry import stepclock
from worker_entry.stepclock import Stamp, StepClock, pair_execution

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0  # seconds since the epoch, like tf.timestamp()


def ms(x: float) -> float:
    return T0 + x / 1e3


def approx(expected):
    return pytest.approx(expected, abs=1e-3)  # doubles around 1.7e9 s resolve ~0.2 us


# ------------------------------------------------------------------------------- pairing (pure)


def test_pair_one_step_one_replica():
    (s,) = pair_execution(ms(0), ms(30), 1, [Stamp(0, 0, ms(4), ms(10), ms(25))])
    assert s.step_ms == approx(30)
    assert (s.input_ms, s.compute_ms, s.pre_collective_ms, s.collective_ms) == approx((4, 6, 10, 15))


def test_pair_takes_the_last_replica_and_each_replicas_first_all_reduce():
    stamps = [
        Stamp(0, 0, ms(2), ms(8), ms(20)),
        Stamp(1, 0, ms(3), ms(12), ms(21)),  # replica 1 is the later one
        Stamp(0, 1, None, ms(22), ms(24)),  # a second all-reduce in the same step (e.g. a second optimizer)
        Stamp(1, 1, None, ms(22.5), ms(26)),
    ]
    (s,) = pair_execution(ms(0), ms(30), 1, stamps)
    assert s.pre_collective_ms == approx(12)  # max over replicas of each one's first t_enter
    assert s.input_ms == approx(3)
    assert s.compute_ms == approx(9)  # max t_enter - max t_data
    assert s.collective_ms == approx(26 - 12)


def test_pair_multi_step_execution_chains_step_starts():
    stamps = [
        Stamp(0, 0, ms(1), ms(5), ms(10)),
        Stamp(0, 0, ms(12), ms(14), ms(20)),
        Stamp(0, 0, ms(21), ms(27), ms(29)),
    ]
    out = pair_execution(ms(0), ms(30), 3, stamps)
    assert [s.step_ms for s in out] == approx([10, 10, 10])  # the execution's mean
    assert [s.pre_collective_ms for s in out] == approx([5, 4, 7])  # from begin, then from prev t_exit
    assert [s.input_ms for s in out] == approx([1, 2, 1])


def test_pair_window_assigns_stamps_to_back_to_back_executions():
    executions = [(ms(0), ms(10), 1), (ms(10.1), ms(20), 1)]
    stamps = [Stamp(0, 0, ms(1), ms(9.5), ms(9.9)), Stamp(0, 0, ms(10.2), ms(10.3), ms(19))]
    first, second = stepclock.pair_window(executions, stamps)
    assert first.pre_collective_ms == approx(9.5) and second.pre_collective_ms == approx(0.2)
    # a stamp from before the window is ignored
    (only,) = stepclock.pair_window(executions[1:], stamps)
    assert only.input_ms == approx(0.1)


def test_pair_ignores_stale_stamps_and_degrades_without_them():
    stale = Stamp(0, 0, ms(-50), ms(-40), ms(-30))  # from before this execution
    (s,) = pair_execution(ms(0), ms(30), 1, [stale, Stamp(0, 0, None, ms(10), ms(25))])
    assert s.pre_collective_ms == approx(10) and s.input_ms is None and s.compute_ms is None
    # no stamps, or stamps that do not split into the execution's steps: only the step time
    (alone,) = pair_execution(ms(0), ms(30), 1, [])
    assert alone.step_ms == approx(30) and alone.pre_collective_ms is None
    two = pair_execution(ms(0), ms(30), 2, [Stamp(0, 0, None, ms(10), ms(25))])
    assert [s.step_ms for s in two] == approx([15, 15]) and [s.pre_collective_ms for s in two] == [None, None]


# ------------------------------------------------------------------------------- the window


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_window_skips_warmup_emits_medians_and_cpu():
    wall, mono, cpu = FakeTime(), FakeTime(), FakeTime()
    pending: list[Stamp] = []
    emitted: list[dict] = []

    def take():
        out = list(pending)
        pending.clear()
        return out

    sc = StepClock(
        1.0,
        min_steps=3,
        emit=lambda kind, **kw: emitted.append({"kind": kind, **kw}),
        wall=lambda: T0 + wall.t,
        clock=mono,
        cpu=cpu,
        take=take,
    )

    def step(pre_ms: float, dur_ms: float = 20.0, cpu_ms: float = 5.0):
        sc.on_batch_begin()
        pending.append(Stamp(0, 0, T0 + wall.t + 0.001, T0 + wall.t + pre_ms / 1e3, T0 + wall.t + (pre_ms + 2) / 1e3))
        wall.t += dur_ms / 1e3
        mono.t += dur_ms / 1e3
        cpu.t += cpu_ms / 1e3
        sc.on_batch_end(1)

    step(5000, dur_ms=6000)  # first execution: tracing; left out
    for pre in (4, 5, 6, 100):  # one outlier: the median ignores it
        step(pre)
    assert emitted == []  # the interval has not passed
    mono.t += 1.0
    step(5)
    (rec,) = emitted
    assert rec["kind"] == "profile" and rec["source"] == "stepclock" and rec["steps"] == 5
    assert rec["pre_collective_ms"] == approx(5) and rec["input_ms"] == approx(1)
    assert rec["compute_ms"] == approx(4) and rec["collective_ms"] == approx(2)
    assert rec["step_ms"] == approx(20) and rec["cpu_ms"] == approx(5)
    assert set(rec) >= {"steps", "step_ms", "pre_collective_ms", "input_ms", "collective_ms", "cpu_ms"}
    json.dumps(rec, allow_nan=False)  # a valid progress record


def test_window_needs_min_steps_and_failures_disable_with_one_warning(capsys):
    emitted: list[dict] = []
    mono = FakeTime()
    sc = StepClock(
        0.5, min_steps=10, emit=lambda kind, **kw: emitted.append(kw), clock=mono, take=list, skip_executions=0
    )
    for _ in range(5):
        mono.t += 1.0
        sc.on_batch_begin()
        sc.on_batch_end()
    assert emitted == []  # 5 < 10 steps although the interval passed

    def broken():
        raise RuntimeError("stamps exploded")

    sc = StepClock(0.5, take=broken, emit=lambda kind, **kw: None)
    for _ in range(20):
        sc.on_batch_begin()
        sc.on_batch_end()  # never raises
    assert sc.enabled is False
    err = capsys.readouterr().err
    assert err.count("tfcluster:") == 1 and "stamps exploded" in err


def test_modes_and_sources_from_env():
    base = {"TFCLUSTER_PROFILE_INTERVAL_S": "10"}
    assert stepclock.mode(base) == "auto"
    assert stepclock.mode({**base, "TFCLUSTER_STEPCLOCK": "1"}) == "force"
    assert stepclock.mode({**base, "TFCLUSTER_STEPCLOCK": "0"}) == "off"
    assert stepclock.mode({}) == "off"  # no interval: no records, so no stamps either
    assert stepclock.mode({**base, "TFCLUSTER_PROFILER": "1"}) == "off"  # the profiler instead
    assert isinstance(stepclock.sampler_from_env(base), StepClock)
    assert stepclock.sampler_from_env({}) is None
    from worker_entry.profiling import ProfileSampler

    assert isinstance(stepclock.sampler_from_env({**base, "TFCLUSTER_PROFILER": "1"}), ProfileSampler)
    assert stepclock.sampler_from_env({**base, "TFCLUSTER_PROFILER": "1"}, tf_profiler=False) is None


def test_patch_and_adopt_are_idempotent_and_leave_user_aggregators_alone():
    import types

    module = types.ModuleType("fake.optimizers.utils")

    def all_reduce_sum_gradients(grads_and_vars):
        return list(grads_and_vars)

    all_reduce_sum_gradients.__module__ = module.__name__
    module.all_reduce_sum_gradients = all_reduce_sum_gradients
    assert stepclock.patch_optimizer_utils(module) is True
    assert stepclock.patch_optimizer_utils(module) is False
    wrapped = module.all_reduce_sum_gradients
    assert wrapped is not all_reduce_sum_gradients and wrapped([(1, "v")]) == [(1, "v")]  # eager: as is

    legacy = types.SimpleNamespace(gradient_aggregator=all_reduce_sum_gradients)  # built before the patch
    assert stepclock.adopt_optimizer(legacy) is True and legacy.gradient_aggregator([]) == []
    assert stepclock.adopt_optimizer(legacy) is False

    def mine(grads_and_vars):
        return grads_and_vars

    own = types.SimpleNamespace(gradient_aggregator=mine)
    assert stepclock.adopt_optimizer(own) is False and own.gradient_aggregator is mine
    assert stepclock.adopt_optimizer(None) is False


# --------------------------------------------------------------- real fits (one process, no cluster)

FIT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import numpy as np
    import tf_keras.src.optimizers.utils as optimizer_utils
    from worker_entry import stamps, stepclock

    original = optimizer_utils.all_reduce_sum_gradients
    calls = {"n": 0}
    def counting(gv):
        calls["n"] += 1
        return original(gv)
    optimizer_utils.all_reduce_sum_gradients = counting
    stepclock.patch_optimizer_utils(optimizer_utils)
    keras = tf.keras

    def fit(case, clock, devices=1, spe=1, legacy=False, jit=False, embedding=False, fail=None, epochs=2, how="ring"):
        os.environ["TFCLUSTER_STEPCLOCK"] = "1" if clock else "0"
        os.environ["TFCLUSTER_STEPCLOCK_DELIVERY"] = how
        if fail:
            saved = getattr(stamps, fail)
            def boom(*a, **k):
                raise RuntimeError("injected " + fail)
            setattr(stamps, fail, boom)
        keras.utils.set_random_seed(7)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
        rng = np.random.default_rng(3)
        if embedding:
            x = rng.integers(0, 50, (512, 4)); y = (x.sum(1, keepdims=True) / 100.0).astype("f4")
        else:
            x = rng.random((512, 10), dtype=np.float32); y = x.sum(1, keepdims=True)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
        with strategy.scope():
            first = keras.layers.Embedding(50, 8) if embedding else keras.layers.Dense(16, activation="relu")
            layers = [keras.layers.Input((4,) if embedding else (10,)), first]
            if embedding:
                layers.append(keras.layers.Flatten())
            model = keras.Sequential(layers + [keras.layers.Dense(1)])
            opt = keras.optimizers.legacy.SGD(0.05) if legacy else keras.optimizers.SGD(0.05)
            model.compile(opt, "mse", steps_per_execution=spe, jit_compile=jit)
        undo = stepclock.wrap_train_step(model)
        got = []
        sc = StepClockCb(got)
        stepclock.drain()
        n0, c0 = stepclock.delivered(), calls["n"]
        h = model.fit(ds, epochs=epochs, steps_per_epoch=12, verbose=0, callbacks=[sc])
        undo()
        if fail:
            setattr(stamps, fail, saved)
        chained = []  # our stamps / py_function with a control input from another stamp (program-order chain)
        for f in model.train_tf_function._list_all_concrete_functions():
            for op in f.graph.get_operations():
                if op.type in ("Timestamp", "EagerPyFunc"):
                    chained += [c.name for c in op.control_inputs if c.type in ("Timestamp", "EagerPyFunc")]
        return {"case": case, "loss": h.history["loss"], "stamps": stepclock.delivered() - n0,
                "all_reduce_traces": calls["n"] - c0, "records": got, "restored": "train_step" not in model.__dict__,
                "chained": chained}

    class StepClockCb(keras.callbacks.Callback):
        def __init__(self, got):
            super().__init__()
            self.spe = 1
            self.clock = stepclock.StepClock(1e-6, min_steps=6, emit=lambda kind, **kw: got.append(kw))
        def on_train_begin(self, logs=None):
            self.spe = self.model._steps_per_execution.numpy().item()
        def on_train_batch_begin(self, batch, logs=None):
            self.clock.on_batch_begin()
        def on_train_batch_end(self, batch, logs=None):
            self.clock.on_batch_end(self.spe)

    cases = [
        fit("off", False), fit("on", True), fit("py_function delivery", True, how="pyfunc"),
        fit("two replicas", True, devices=2),
        fit("two replicas, 3 steps per execution", True, devices=2, spe=3),
        fit("two replicas off", False, devices=2, spe=3),
        fit("legacy optimizer", True, legacy=True), fit("legacy off", False, legacy=True),
        fit("embedding", True, embedding=True), fit("embedding off", False, embedding=True),
        fit("jit_compile", True, jit=True, epochs=1),
        fit("fail before", True, fail="_before"), fit("fail after", True, fail="_after"),
        fit("fail data", True, fail="_begin_step"),
    ]
    print("RESULT " + json.dumps(cases))
    """
)


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", TFCLUSTER_PROFILE_INTERVAL_S="5")
    proc = subprocess.Popen(
        [sys.executable, "-c", FIT_SCRIPT],
        env=env,
        cwd=tmp_path_factory.mktemp("fits"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, err[-4000:]
    return {c["case"]: c for c in json.loads(lines[0][7:])}, err


def test_real_fit_records_every_step_and_losses_are_unchanged(fits):
    cases, _ = fits
    off = cases["off"]
    assert off["stamps"] == 0
    for on in (cases["on"], cases["py_function delivery"]):  # the ring (default) and the py_function
        assert on["loss"] == off["loss"]  # bit-identical training with the clock
        assert on["stamps"] == 24 and on["restored"]  # one stamp per step; train_step restored after fit
        assert on["all_reduce_traces"] == off["all_reduce_traces"]  # the all-reduce is built once per trace
        assert len(on["records"]) >= 2
        for rec in on["records"]:
            assert rec["source"] == "stepclock" and rec["steps"] >= 6
            for key in ("step_ms", "pre_collective_ms", "input_ms", "compute_ms", "collective_ms", "cpu_ms"):
                assert rec[key] is not None and rec[key] >= 0, rec
            # (t_data's op may run a little after the batch arrived: input_ms can exceed pre by a hair)
            assert rec["input_ms"] <= rec["pre_collective_ms"] + 0.5 and rec["pre_collective_ms"] <= rec["step_ms"], rec


def test_real_fit_two_replicas_several_steps_per_execution(fits):
    cases, _ = fits
    two, off = cases["two replicas, 3 steps per execution"], cases["two replicas off"]
    assert two["loss"] == off["loss"]
    assert two["stamps"] == 2 * 24  # each replica delivers its stamps
    rec = two["records"][0]
    assert rec["steps"] % 3 == 0 and rec["pre_collective_ms"] is not None and rec["input_ms"] is not None
    # The replicas are traced one after the other into one graph: automatic control dependencies would
    # chain replica 1's t_data after replica 0's t_enter. Our ops are exempt from that chain.
    one = cases["two replicas"]
    assert one["stamps"] == 2 * 24 and one["loss"] == off["loss"]
    assert one["chained"] == [] and cases["on"]["chained"] == []


def test_real_fit_legacy_optimizer_and_indexed_slices(fits):
    cases, _ = fits
    assert cases["legacy optimizer"]["loss"] == cases["legacy off"]["loss"]
    assert cases["legacy optimizer"]["stamps"] == 24  # patched before the optimizer was built
    assert cases["embedding"]["loss"] == cases["embedding off"]["loss"]  # IndexedSlices gradients
    assert cases["embedding"]["stamps"] == 24


def test_real_fit_xla_and_failures_leave_the_step_alone(fits):
    cases, err = fits
    assert cases["jit_compile"]["stamps"] == 0 and len(cases["jit_compile"]["loss"]) == 1  # XLA: no stamps
    for case in ("fail before", "fail after", "fail data"):
        assert cases[case]["loss"] == cases["on"]["loss"], case
        assert cases[case]["all_reduce_traces"] == cases["on"]["all_reduce_traces"], case  # never twice
    assert cases["fail before"]["stamps"] == 0
    assert cases["fail after"]["stamps"] == 0
    assert cases["fail data"]["stamps"] == 24  # still stamped, without t_data
    lines = [x for x in err.splitlines() if x.startswith("tfcluster:")]
    assert len(lines) == 3, lines
    assert all("injected" in x and "step unchanged" in x for x in lines), lines


# ------------------------------------------------------------------------- 3 workers (e2e)


def run_cluster(extra: list[str], steps: int, interval_s: float = 1.0, num_workers: int = 3, env_extra=None):
    """The demo on ``num_workers`` local MWMS workers under the instrumentation (step clock on)."""
    from worker_entry.examples.local_cluster import run_local_cluster

    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    env.update(
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([str(ROOT / "worker_entry" / "_site"), str(ROOT)]),
        TFCLUSTER_INSTRUMENT="1",
        TFCLUSTER_PROFILE_INTERVAL_S=str(interval_s),
        # No TFCLUSTER_COLLECTIVE_TIMEOUT_S: with a collective timeout TF 2.21 keeps ~4 threads per
        # collective alive for the whole timeout (thousands per worker here) and steps get slower.
        **(env_extra or {}),
    )
    argv = [
        sys.executable,
        "-m",
        "worker_entry.examples.keras_synthetic",
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(steps),
    ]
    results = run_local_cluster([*argv, *extra], num_workers, env=env, timeout_s=150, cwd=str(ROOT))
    for r in results:
        assert r.returncode == 0, r.output[-3000:]
        assert not [x for x in r.output.splitlines() if x.startswith("tfcluster:")], r.output[-3000:]
    return results


def medians(
    records: list[dict], keys=("pre_collective_ms", "input_ms", "compute_ms", "collective_ms", "step_ms", "cpu_ms")
):
    return {k: round(statistics.median(r[k] for r in records if r.get(k) is not None), 2) for k in keys}


@pytest.mark.e2e
def test_compute_bound_straggler_shows_as_compute_not_input():
    """worker:2 multiplies 30 extra 256x256 matrices per forward pass: its excess before the all-reduce
    is between batch and gradients (compute_ms), not waiting for the batch (input_ms)."""
    from orchestrator.supervise import find_straggler

    results = run_cluster(["--extra-matmuls", "30", "--slow-task", "worker:2"], steps=150)
    profiles = [r.of_kind("profile") for r in results]
    assert all(len(p) >= 2 and all(x["source"] == "stepclock" for x in p) for p in profiles), profiles
    m = [medians(p) for p in profiles]
    print(json.dumps({f"worker:{i}": x for i, x in enumerate(m)}))
    comp = [x["compute_ms"] for x in m]
    inp = [x["input_ms"] for x in m]
    assert comp[2] > 4 * max(comp[0], comp[1], 0.5) and comp[2] > 5, m
    assert inp[2] < comp[2] / 2, m  # not an input problem
    pre = [x["pre_collective_ms"] for x in m]
    assert pre[2] > 2 * max(pre[0], pre[1]), m
    finding = find_straggler({f"worker:{i}": profiles[i][-1] for i in range(3)}, ratio=1.5, min_ms=5.0)
    assert finding is not None and finding.task == "worker:2" and finding.cause != "input pipeline", finding
