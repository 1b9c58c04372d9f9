"""Progress records: the non-blocking writer, report_step, and the Keras callback (tf_keras)."""

from __future__ import annotations

import json
import os

import pytest

from worker_entry.instrument import keras_callback, progress


def _read_records(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return [json.loads(line) for line in b"".join(chunks).splitlines()]


@pytest.fixture
def pipe(monkeypatch):
    """A progress pipe wired to TFCLUSTER_PROGRESS_FD; yields the read end."""
    r, w = os.pipe()
    monkeypatch.setenv(progress.ENV_FD, str(w))
    monkeypatch.setattr(progress, "_counters", {})
    monkeypatch.setattr(progress, "_writer", None)  # fds are reused between tests: never keep a writer
    yield r
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_no_fd_is_a_noop(monkeypatch):
    monkeypatch.delenv(progress.ENV_FD, raising=False)
    monkeypatch.setattr(progress, "_writer", None)
    assert progress.get_writer().enabled is False
    assert progress.emit("progress", steps=1) is False
    progress.report_step(5)  # must not raise
    assert progress._counters.get("train") is None or progress._counters["train"].steps == 0


def test_records_are_json_lines_with_kind_and_ts(pipe):
    assert progress.emit("strategy", communication="ring", timeout_s=None)
    (rec,) = _read_records(pipe)
    assert rec["kind"] == "strategy" and rec["communication"] == "ring" and rec["timeout_s"] is None
    assert isinstance(rec["ts"], float)


def test_full_pipe_drops_without_blocking_and_recovers(pipe):
    writer = progress.get_writer()
    written = 0
    while writer.emit("progress", steps=written, pad="x" * 1000):
        written += 1
        assert written < 10_000, "the pipe never filled: writes are not non-blocking"
    assert writer.dropped >= 1
    records = _read_records(pipe)
    assert len(records) == written  # every record that was written is whole (all-or-nothing writes)
    assert [r["steps"] for r in records] == list(range(written))
    assert writer.emit("progress", steps=-1)  # drained: writes work again


def test_closed_reader_disables_writer(pipe):
    os.close(pipe)
    writer = progress.get_writer()
    assert writer.emit("progress", steps=1) is False
    assert writer.enabled is False  # EPIPE: the reader is gone for good
    progress.report_step(1)  # still no exception


def test_oversized_record_is_dropped(pipe):
    assert progress.emit("progress", blob="y" * 5000) is False
    assert _read_records(pipe) == []


def test_a_coordinators_schedules_give_way_to_the_scripts_own_report_of_the_same_steps(pipe):
    """A PS chief's schedules are counted at once (the hook); when the script then reports those very
    steps itself (report_step after its join), they are counted once, not twice."""
    now = [100.0]
    c = progress.StepCounter("train", min_interval_s=0.25, clock=lambda: now[0])
    for _ in range(10):
        c.add(1, examples=32, source="coordinator")
    assert c.steps == 10
    now[0] += 1.0
    c.add(10, examples=320, source="user")  # the same 10 steps, from report_step
    assert (c.steps, c.examples, c.owner) == (10, 320, "user")
    for _ in range(5):
        c.add(1, examples=32, source="coordinator")  # the hook's later counts are the script's now
    c.add(5, examples=160, source="user")
    assert (c.steps, c.examples) == (15, 480)


def test_step_counter_rate_limits_and_accumulates(pipe):
    now = [100.0]
    c = progress.StepCounter("train", min_interval_s=0.25, clock=lambda: now[0])
    assert c.add(1, examples=64, epoch=0) is True  # first record at once
    for _ in range(9):
        now[0] += 0.01
        assert c.add(1, examples=64) is False  # within 0.25 s: counted, not written
    now[0] += 0.2
    assert c.add(1, examples=64, epoch=1) is True
    records = _read_records(pipe)
    assert [r["steps"] for r in records] == [1, 11]
    assert [r["examples"] for r in records] == [64, 704]
    assert records[1]["epoch"] == 1 and records[1]["phase"] == "train"
    # 10 steps in the 0.29 s since the previous record
    assert records[1]["step_time_s"] == pytest.approx(0.029, rel=1e-6)


def test_step_clock_records_carry_the_last_steps_end_not_the_polls_time(pipe):
    """The step clock counts steps by polling; a record timed at the poll would put each worker's
    points at its own poller's phase, and the launcher's interpolated rates of one synchronous job
    would differ by the pollers' delays. Timed at the last step's end, every worker's points agree."""
    now = [100.0]
    c = progress.StepCounter("train", min_interval_s=0.25, clock=lambda: now[0])
    c.add(1, source="stamps", at=1_700_000_000.0)  # the first poll opens the window: counted, not written
    now[0] += 1.0
    assert c.add(5, source="stamps", at=1_700_000_004.5) is True
    now[0] += 1.0
    assert c.add(3, source="stamps", at=1_700_000_005.25) is True
    records = _read_records(pipe)
    assert [(r["steps"], r["ts"]) for r in records] == [(6, 1_700_000_004.5), (9, 1_700_000_005.25)]


def test_report_step_is_cumulative(pipe):
    for _ in range(3):
        progress.report_step(2, examples=10, epoch=4)
    progress.flush()
    records = _read_records(pipe)
    assert records[0]["steps"] == 2
    assert records[-1]["steps"] == 6 and records[-1]["examples"] == 30 and records[-1]["epoch"] == 4


def test_keras_callback_reports_train_test_predict(pipe, monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    np = pytest.importorskip("numpy")
    tf_keras = pytest.importorskip("tf_keras")
    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)
    x = np.random.rand(256, 4).astype("float32")
    y = np.random.rand(256, 1).astype("float32")
    model = tf_keras.Sequential([tf_keras.layers.Input((4,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
    cb = keras_callback.progress_callback(batch_size=32, profile=False, base=tf_keras.callbacks.Callback)
    assert isinstance(cb, tf_keras.callbacks.Callback) and cb._tfcluster_progress
    model.fit(x, y, batch_size=32, epochs=2, validation_data=(x, y), callbacks=[cb], verbose=0)
    model.predict(x, batch_size=64, callbacks=[cb], verbose=0)
    records = [r for r in _read_records(pipe) if r["kind"] == "progress"]
    train = [r for r in records if r["phase"] == "train"]
    assert train and train[-1]["steps"] == 16  # 2 epochs x 8 steps, counted through steps_per_execution=2
    assert train[-1]["examples"] == 16 * 32 and train[-1]["epoch"] == 1
    assert [r["steps"] for r in train] == sorted(r["steps"] for r in train)
    test = [r for r in records if r["phase"] == "test"]
    assert test and test[-1]["steps"] == 16  # validation: 8 steps per epoch
    predict = [r for r in records if r["phase"] == "predict"]
    assert predict and predict[-1]["steps"] == 4


def test_a_ps_coordinators_schedules_are_steps_and_a_join_dates_them(pipe, monkeypatch):
    """Issue 32.1: ``ClusterCoordinator.schedule`` from the script is a step, Keras's own is not; a ``join``
    writes a record carrying the time the scheduled steps were done."""
    import types

    from worker_entry.instrument.coordinator import patch_coordinator

    class ClusterCoordinator:
        def schedule(self, fn, args=None):
            return fn(*(args or ()))

        def join(self):
            return None

    module = types.SimpleNamespace(ClusterCoordinator=ClusterCoordinator)
    assert patch_coordinator(module) and not patch_coordinator(module)  # once
    c = ClusterCoordinator()
    for _ in range(3):
        assert c.schedule(lambda x: x + 1, args=(1,)) == 2  # the user's call, unchanged
    keras_loop = {"__name__": "tf_keras.src.engine.training", "c": c}
    exec("for _ in range(5): c.schedule(lambda: None)", keras_loop)  # fit's schedules: its callback counts
    assert progress.counter("train").steps == 3 and progress.counter("train").owner == "coordinator"
    monkeypatch.setattr(progress.time, "time", lambda: 1234.5)
    c.join()
    last = [json.loads(x) for x in os.read(pipe, 65536).splitlines()][-1]
    assert (last["kind"], last["steps"], last["ts"]) == ("progress", 3, 1234.5)


def test_a_scheduled_evaluation_is_not_a_training_step(pipe):
    """Issue 32.1: the tutorial schedules ``eval_step`` (no gradient) with the same coordinator after its
    training loop: those are ``test`` steps; a function computing a gradient is a training step, also when
    its gradient is taken inside a nested ``tf.function``. Real traced functions, read from their graphs."""
    import types

    import tensorflow as tf

    from worker_entry.instrument.coordinator import patch_coordinator

    class ClusterCoordinator:
        def schedule(self, fn, args=None):
            return fn(*(args or ()))

        def join(self):
            return None

    patch_coordinator(types.SimpleNamespace(ClusterCoordinator=ClusterCoordinator))
    w = tf.Variable(tf.ones((3, 1)))

    @tf.function
    def step_fn(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    @tf.function
    def inner(x):
        return tf.gradients(tf.reduce_sum(tf.matmul(x, w)), [w])[0]

    @tf.function
    def nested_step(x):
        w.assign_sub(0.1 * inner(x))
        return tf.constant(0.0)

    @tf.function
    def eval_step(x):
        return tf.reduce_mean(tf.matmul(x, w))

    nested = nested_step.get_concrete_function(tf.TensorSpec((None, 3), tf.float32))  # a ConcreteFunction too
    c, x = ClusterCoordinator(), tf.ones((2, 3))
    for _ in range(3):
        c.schedule(step_fn, args=(x,))
    c.schedule(nested, args=(x,))
    c.join()
    for _ in range(2):
        c.schedule(eval_step, args=(x,))
    c.join()
    assert progress.counter("train").steps == 4 and progress.counter("test").steps == 2
    records = [r for r in _read_records(pipe) if r["kind"] == "progress"]
    assert max(r["steps"] for r in records if r["phase"] == "train") == 4
