"""Zero-code instrumentation: the sitecustomize bootstrap, the post-import hooks, and real TF scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from worker_entry.instrument import hooks as instrument
from worker_entry.instrument import keras_callback, progress

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "worker_entry" / "_site"


def run_python(
    code: str, env: dict, *, cwd: Path, python: str = sys.executable, progress_pipe: bool = True, timeout=180
):
    """Run ``code`` in a child; returns (returncode, stdout, stderr, progress records). Killed by PID on exit."""
    env = {k: v for k, v in env.items() if k != progress.ENV_FD}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    r = w = None
    pass_fds: tuple[int, ...] = ()
    if progress_pipe:
        r, w = os.pipe()
        env[progress.ENV_FD] = str(w)
        pass_fds = (w,)
    proc = subprocess.Popen(
        [python, "-c", code],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=pass_fds,
    )
    try:
        if w is not None:
            os.close(w)
            w = None
        out, err = proc.communicate(timeout=timeout)
        records = []
        if r is not None:
            with os.fdopen(r, "rb") as f:
                r = None
                records = [json.loads(line) for line in f.read().splitlines()]
        return proc.returncode, out, err, records
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for fd in (r, w):
            if fd is not None:
                os.close(fd)


def base_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFCLUSTER_") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(SITE), TF_USE_LEGACY_KERAS="1", **extra)
    return env


def tfcluster_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tfcluster:")]


# ---------------------------------------------------------------------- bootstrap (no TensorFlow)

PROBE = textwrap.dedent(
    """
    import json, sys
    print(json.dumps({
        "finder": any(type(f).__name__ == "PostImportFinder" for f in sys.meta_path),
        "instrument": sorted(n for n in sys.modules if n.endswith(".instrument")),
        "user_site": getattr(sys, "_user_sitecustomize_ran", False),
        "path": sys.path,
        "tf": "tensorflow" in sys.modules,
    }))
    """
)


@pytest.fixture
def user_site(tmp_path: Path) -> Path:
    d = tmp_path / "usersite"
    d.mkdir()
    (d / "sitecustomize.py").write_text("import sys\nsys._user_sitecustomize_ran = True\n")
    return d


@pytest.mark.parametrize("instrument_value", ["1", "0"])
def test_user_sitecustomize_is_chained(tmp_path, user_site, instrument_value):
    env = base_env(TFCLUSTER_INSTRUMENT=instrument_value)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(user_site)])
    rc, out, err, _ = run_python(PROBE, env, cwd=tmp_path, progress_pipe=False)
    assert rc == 0, err
    probe = json.loads(out)
    assert probe["user_site"] is True  # the user's sitecustomize ran although ours shadows it
    assert probe["finder"] is (instrument_value == "1")
    assert probe["tf"] is False  # bootstrap imports nothing heavy
    assert str(SITE) in probe["path"]  # our directory is back where it was
    assert tfcluster_lines(err) == []


def test_foreign_interpreter_loads_instrument_by_path(tmp_path, user_site):
    """A venv without our package: instrument.py is loaded by path; nothing of ours joins sys.path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(user_site)])
    _rc, out, err, _ = run_python(
        PROBE + "\nimport worker_entry\n", env, cwd=tmp_path, python=python, progress_pipe=False
    )
    assert "No module named 'worker_entry'" in err  # the venv really does not have our package
    probe = json.loads(out)
    assert probe["finder"] is True and probe["user_site"] is True
    assert probe["instrument"] == ["_tfcluster_worker_entry.instrument"]
    import sysconfig

    ours = {str(ROOT), sysconfig.get_paths()["purelib"]}  # our checkout, our interpreter's site-packages
    assert not ours & set(probe["path"])


# ---------------------------------------------------------------------- hooks, in process (no TF)


def test_post_import_hook_runs_after_module_and_failures_are_swallowed(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "tfc_fake_mod.py"
    pkg.write_text("VALUE = 1\n")
    bad = tmp_path / "tfc_fake_bad.py"
    bad.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def good_hook(m):
        m.VALUE += 10  # proves the module had executed before the hook

    def bad_hook(m):
        raise RuntimeError("hook broke")

    finder = instrument.PostImportFinder({"tfc_fake_mod": good_hook, "tfc_fake_bad": bad_hook})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    try:
        import tfc_fake_bad
        import tfc_fake_mod

        assert tfc_fake_mod.VALUE == 11
        assert tfc_fake_bad.VALUE == 1  # imported normally despite the failing hook
        assert "exec_module" not in vars(tfc_fake_mod.__spec__.loader)  # loader left as found
    finally:
        sys.modules.pop("tfc_fake_mod", None)
        sys.modules.pop("tfc_fake_bad", None)
    err = capsys.readouterr().err
    assert err.count("tfcluster:") == 1 and "hook broke" in err


class _FakeCallbackBase:
    def __init__(self) -> None:
        pass


def _fake_model_class():
    class Model:
        def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, **kw):
            return {"callbacks": callbacks, "x": x}

    return Model


def test_fit_hook_appends_once_and_keeps_user_list(monkeypatch):
    monkeypatch.setattr(instrument, "_callback_base", lambda pkg: _FakeCallbackBase)
    Model = _fake_model_class()
    assert instrument.patch_fit(Model, "fake") is True
    assert instrument.patch_fit(Model, "fake") is False  # idempotent

    mine = [object()]
    got = Model().fit([[1.0]], [[1.0]], batch_size=8, callbacks=mine)["callbacks"]
    assert mine == mine[:1] and len(mine) == 1  # the user's list is not mutated
    assert len(got) == 2 and got[0] is mine[0] and got[1]._tfcluster_progress
    assert got[1].batch_size == 8

    got = Model().fit(None, None, None, 1, 0, [])["callbacks"]  # positional callbacks
    assert len(got) == 1 and got[0]._tfcluster_progress

    already = keras_callback.callback_class(_FakeCallbackBase)()
    got = Model().fit(callbacks=[already])["callbacks"]
    assert got == [already]  # no second progress callback


def test_fit_hook_failure_leaves_the_call_alone(monkeypatch, capsys):
    def broken(pkg):
        raise ImportError("no keras here")

    monkeypatch.setattr(instrument, "_callback_base", broken)
    Model = _fake_model_class()
    instrument.patch_fit(Model, "fake")
    mine = [object()]
    assert Model().fit(callbacks=mine)["callbacks"] is mine
    assert "no keras here" in capsys.readouterr().err


# ---------------------------------------------------------------------- real TensorFlow scripts

FIT_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import tensorflow as tf
    plain = tf.distribute.MultiWorkerMirroredStrategy()            # unmodified user code
    opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING, timeout_seconds=42.0)
    own = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    with plain.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.random.rand(640, 4).astype("float32"); y = x.sum(axis=1, keepdims=True)
    h = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    def o(s):
        c = s.extended._communication_options
        return [c.implementation.name, c.timeout_seconds]
    from tensorflow.python.distribute import cross_device_ops
    wrapped = getattr(cross_device_ops.CollectiveAllReduce._all_reduce, "_tfcluster_stepclock", False)
    print(json.dumps({"plain": o(plain), "own": o(own), "epochs": len(h.history["loss"]), "step_clock": wrapped}))
    """
)


def test_fit_script_reports_progress_and_keeps_own_options(tmp_path):
    env = base_env(TFCLUSTER_INSTRUMENT="1", TFCLUSTER_COMMUNICATION="ring", TFCLUSTER_COLLECTIVE_TIMEOUT_S="7")
    rc, out, err, records = run_python(FIT_SCRIPT, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["plain"] == ["RING", 7.0]  # ours, from the environment
    assert result["own"] == ["RING", 42.0]  # the script's own options are kept
    strategies = [r for r in records if r["kind"] == "strategy"]
    assert [(r["communication"], r["timeout_s"]) for r in strategies] == [("ring", 7.0), ("ring", 42.0)]
    steps = [r["steps"] for r in records if r["kind"] == "progress" and r["phase"] == "train"]
    assert steps and steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[-1] == 60  # 3 epochs x 20 steps
    last = [r for r in records if r["kind"] == "progress"][-1]
    assert last["examples"] == 60 * 32 and last["epoch"] == 2
    assert result["step_clock"] is True  # MWMS's all-reduce is wrapped (it stamps only under multi-worker MWMS)
    assert [r for r in records if r["kind"] == "profile"] == []  # one worker: no collective, no stamps
    assert tfcluster_lines(err) == []


def test_opt_out_means_no_records(tmp_path):
    env = base_env(TFCLUSTER_INSTRUMENT="0", TFCLUSTER_COMMUNICATION="ring", TFCLUSTER_COLLECTIVE_TIMEOUT_S="7")
    rc, out, err, records = run_python(FIT_SCRIPT, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    assert records == []
    result = json.loads(out.strip().splitlines()[-1])
    assert result["plain"] == ["AUTO", None]  # TF's defaults
    assert result["step_clock"] is False  # nothing patched


def test_broken_environment_warns_once_and_training_runs(tmp_path):
    env = base_env(TFCLUSTER_INSTRUMENT="1", TFCLUSTER_COMMUNICATION="carrier-pigeon")
    rc, out, err, records = run_python(FIT_SCRIPT, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["plain"] == ["AUTO", None] and result["epochs"] == 3  # as without us
    lines = tfcluster_lines(err)
    assert len(lines) == 1 and "carrier-pigeon" in lines[0], err[-3000:]
    assert any(r["kind"] == "progress" for r in records)  # the rest of the instrumentation still works


STEP_CLOCK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    from tensorflow.python.distribute import collective_util, cross_device_ops
    devices = ["/cpu:0", "/cpu:1"]    # two replicas reducing with MWMS's collectives, in one process
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=cross_device_ops.CollectiveAllReduce(devices, 2, collective_util.Options()))
    tf.keras.utils.set_random_seed(5)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
    x = np.random.default_rng(1).random((3200, 4)).astype("float32"); y = x.sum(axis=1, keepdims=True)
    dist = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)))

    @tf.function
    def train_step(batch):                 # an unmodified custom loop: no callback anywhere
        def step(inputs):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(inputs[0]) - inputs[1]) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step, args=(batch,)), axis=None)

    losses = [float(train_step(next(dist))) for _ in range(300)]
    print(json.dumps({"loss": losses[-5:]}))
    """
)


def test_custom_loop_gets_steps_and_profiles_through_the_instrumentation(tmp_path):
    """Zero-code: an unmodified custom loop reports steps (derived from the stamps at the all-reduce) and
    step-clock profile records; losses equal those without the clock."""
    env = base_env(TFCLUSTER_INSTRUMENT="1", TFCLUSTER_PROFILE_INTERVAL_S="0.2", TFCLUSTER_STEPCLOCK="1")
    rc, out, err, records = run_python(STEP_CLOCK_SCRIPT, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    on = json.loads(out.strip().splitlines()[-1])
    steps = [r["steps"] for r in records if r["kind"] == "progress"]
    assert steps and steps == sorted(steps) and steps[-1] == 300, records  # the last one is written at exit
    last = [r for r in records if r["kind"] == "progress"][-1]
    assert last["examples"] == 300 * 32  # the static batch of the distributed dataset
    profiles = [r for r in records if r["kind"] == "profile"]
    assert profiles and all(p["source"] == "stepclock" and p["steps"] >= 5 for p in profiles), records
    for p in profiles:
        parts = sum(p[f"{k}_ms"] for k in ("input", "compute", "collective", "update", "host", "other"))
        assert parts == pytest.approx(p["step_ms"], abs=0.01)
    assert tfcluster_lines(err) == []
    env["TFCLUSTER_STEPCLOCK"] = "0"
    rc, out, err, records = run_python(STEP_CLOCK_SCRIPT, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["loss"] == on["loss"]  # same training without the clock
    assert [r for r in records if r["kind"] in ("profile", "progress")] == []


def test_keras3_fit_is_instrumented_too(tmp_path):
    pytest.importorskip("keras", minversion="3")
    code = textwrap.dedent(
        """
        import numpy as np, keras
        m = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        m.fit(np.ones((256, 4), "f4"), np.ones((256, 1), "f4"), batch_size=32, epochs=2, verbose=0)
        print(keras.__version__)
        """
    )
    env = base_env(TFCLUSTER_INSTRUMENT="1")
    env.pop("TF_USE_LEGACY_KERAS")
    rc, out, err, records = run_python(code, env, cwd=tmp_path)
    assert rc == 0, err[-3000:]
    assert out.strip().startswith("3.")
    train = [r for r in records if r["kind"] == "progress" and r["phase"] == "train"]
    assert train and train[-1]["steps"] == 16 and train[-1]["examples"] == 16 * 32
    assert tfcluster_lines(err) == []


@pytest.mark.e2e
def test_two_local_workers_plain_mwms_script(tmp_path):
    """The unmodified demo script on 2 MWMS workers trains under the instrumentation and reports."""
    from worker_entry.examples.local_cluster import run_local_cluster

    env = base_env(TFCLUSTER_INSTRUMENT="1", TFCLUSTER_COMMUNICATION="ring", TFCLUSTER_COLLECTIVE_TIMEOUT_S="30")
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT)])
    argv = [sys.executable, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "2", "--steps-per-epoch", "30"]
    results = run_local_cluster(argv, 2, env=env, timeout_s=150, cwd=str(tmp_path))
    for r in results:
        assert r.returncode == 0, r.output[-3000:]
        assert "epoch 2/2 loss=" in r.output
        assert [(s["communication"], s["timeout_s"]) for s in r.of_kind("strategy")] == [("ring", 30.0)]
        steps = [p["steps"] for p in r.of_kind("progress") if p["phase"] == "train"]
        assert steps and steps[-1] == 60 and steps == sorted(steps)
    # both workers ran the same synchronous training: identical final loss lines
    losses = [[line.split("loss=")[1].split()[0] for line in r.output.splitlines() if "loss=" in line] for r in results]
    assert losses[0] == losses[1]


def test_module_types():
    # instrument must import with the standard library only (it runs in foreign interpreters)
    assert isinstance(instrument, types.ModuleType)
    code = "import sys; import worker_entry.instrument.hooks, worker_entry.instrument.progress, worker_entry.instrument.profiler.sampler, worker_entry.instrument.strategy; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_global_batch_size_of_distributed_datasets():
    """examples/s needs the global batch: from the original dataset, or per-replica batch x replicas."""
    code = r"""
import os, json
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from worker_entry.instrument.hooks import _global_batch_size
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
s = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rows = tf.data.Dataset.from_tensor_slices((tf.zeros([64, 3]), tf.zeros([64, 1]))).repeat()
def fn(ctx):
    return rows.batch(ctx.get_per_replica_batch_size(16), drop_remainder=True)
out = {
    "plain": _global_batch_size(rows.batch(16, drop_remainder=True), None),
    "unknown": _global_batch_size(rows.batch(16), None),
    "distribute": _global_batch_size(s.experimental_distribute_dataset(rows.batch(16, drop_remainder=True)), None),
    "from_function": _global_batch_size(s.distribute_datasets_from_function(fn), None),
    "from_function_unknown": _global_batch_size(s.distribute_datasets_from_function(lambda c: rows.batch(8)), None),
    "arrays": _global_batch_size(tf.zeros([10, 3]).numpy(), 5),
}
print(json.dumps(out))
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "plain": 16,
        "unknown": None,
        "distribute": 16,
        "from_function": 16,
        "from_function_unknown": None,
        "arrays": 5,
    }
