"""The evaluator's metrics on the node: bounded as they are reported (``progress.report_evaluation``),
captured from ``model.evaluate`` in an evaluator task (the instrumentation; under ``SidecarEvaluator``
with the checkpoint it evaluated), and validated by worker_entry before they travel on."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from test_instrument import _FakeCallbackBase, base_env, run_python, tfcluster_lines

from worker_entry import protocol as p
from worker_entry.instrument import hooks as instrument
from worker_entry.instrument import progress


@pytest.fixture
def records(monkeypatch):
    """What ``progress.emit`` writes in this process, read back from a pipe."""
    r, w = os.pipe()
    monkeypatch.setenv(progress.ENV_FD, str(w))
    monkeypatch.setitem(progress._evaluated, "count", 0)
    monkeypatch.setitem(progress._evaluated, "checkpoint", None)
    got: list[dict] = []

    def read() -> list[dict]:
        try:
            data = os.read(r, 1 << 20)
        except BlockingIOError:
            data = b""
        got.extend(json.loads(line) for line in data.splitlines())
        return got

    os.set_blocking(r, False)
    yield read
    os.close(r)
    os.close(w)


def test_metrics_are_bounded_and_what_is_left_out_is_counted():
    logs = {
        "loss": 0.5,
        "nan": float("nan"),
        "inf": float("inf"),
        "x" * 65: 1.0,
        "": 2.0,
        "text": "0.5",
        "flag": True,
        "huge": 10**400,
        "count": 3,
        **{f"m{i}": float(i) for i in range(40)},
    }
    values, dropped = progress.metric_values(logs)
    assert len(values) == 32
    assert values["loss"] == 0.5 and values["count"] == 3.0 and "nan" not in values and "text" not in values
    assert dropped == len(logs) - 32
    assert progress.metric_values("not a mapping") == ({}, 0)


def test_report_evaluation_sends_one_valid_record_and_warns_once(records, capsys):
    progress.note_checkpoint("/ckpt/" + "d" * 600 + "/ckpt-3")
    assert progress.report_evaluation({"loss": 0.25, "acc": float("nan")}, step=60) is True
    assert progress.report_evaluation({"loss": 0.125, "bad": float("inf")}) is True
    first, second = records()
    assert first["kind"] == "evaluation" and first["count"] == 1 and first["step"] == 60
    assert first["metrics"] == {"loss": 0.25} and first["dropped"] == 1 and first["source"] == "sidecar"
    assert first["checkpoint"].endswith("/ckpt-3") and len(first["checkpoint"]) == 512  # its tail
    assert second["count"] == 2 and "checkpoint" not in second and second["source"] == "evaluate"
    for rec in (first, second):  # what worker_entry's runner does with each record
        msg = p.NODE_MESSAGES[rec["kind"]].from_dict(rec)
        assert msg.metrics == rec["metrics"]
    assert capsys.readouterr().err.count("tfcluster: evaluation:") == 1


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"count": 1, "metrics": {"a": 1e999}}, "metrics.a"),
        ({"count": 1, "metrics": {"x" * 65: 1.0}}, "metrics"),
        ({"count": 1, "metrics": {f"m{i}": 1.0 for i in range(33)}}, "metrics"),
        ({"count": 1, "metrics": {"a": "1"}}, "metrics.a"),
        ({"count": 0, "metrics": {}}, "count"),
        ({"count": 1, "step": -1}, "step"),
        ({"count": 1, "checkpoint": "c" * 513}, "checkpoint"),
    ],
)
def test_a_bad_evaluation_is_one_protocol_error_naming_its_field(record, field):
    with pytest.raises(p.ProtocolError) as err:
        p.parse_message(json.dumps({"type": "evaluation", **record}).encode())
    assert err.value.field == f"evaluation.{field}"


def test_the_runner_skips_a_bad_evaluation_record_and_says_so_once():
    import os

    from worker_entry.agent.progressin import ProgressPipe
    from worker_entry.agent.runner import Runner

    sent: list = []
    said: list[bytes] = []
    r, w = os.pipe()
    runner = Runner.__new__(Runner)  # only what _read_progress uses
    runner.bad_told, runner.started_how = False, None
    runner.progress_in, runner.progress_fd = ProgressPipe(r), r
    runner.msg, runner._emit = sent.append, lambda stream, data: said.append(data)
    os.write(w, b'{"kind":"evaluation","count":1,"metrics":{"loss":1e999}}\n')
    os.write(w, b'{"kind":"evaluation","count":2,"metrics":{"' + b"x" * 99 + b'":1}}\n')
    os.write(w, b'{"kind":"evaluation","count":3,"metrics":{"loss":0.5},"step":7}\n')
    try:
        assert runner._read_progress()
    finally:
        os.close(w)
        os.close(r)
    assert [type(m).__name__ for m in sent] == ["Evaluation"] and sent[0].metrics == {"loss": 0.5} and sent[0].step == 7
    assert runner.progress_in.bad == 2 and len(said) == 1 and b"ignoring a bad progress record" in said[0]


def _fake_model():
    class Model:
        def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", steps=None, callbacks=None, **kw):
            return callbacks

    return Model


def test_evaluate_gets_the_evaluation_callback_only_in_an_evaluator_task(monkeypatch):
    monkeypatch.setattr(instrument, "_callback_base", lambda pkg: _FakeCallbackBase)
    Model = _fake_model()
    assert instrument.patch_evaluate(Model, "fake") is True and instrument.patch_evaluate(Model, "fake") is False
    monkeypatch.setenv("TFCLUSTER_TASK_TYPE", "worker")
    assert Model().evaluate([1.0]) is None
    monkeypatch.setenv("TFCLUSTER_TASK_TYPE", "evaluator")
    mine = [object()]
    got = Model().evaluate([1.0], callbacks=mine)
    assert len(got) == 2 and got[0] is mine[0] and got[1]._tfcluster_evaluation and len(mine) == 1
    assert Model().evaluate([1.0], _use_cached_eval_dataset=True) is None  # fit's validation: not an evaluation
    monkeypatch.delenv("TFCLUSTER_TASK_TYPE")
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}})
    )
    assert len(Model().evaluate([1.0])) == 1


SIDECAR_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    ckpt = os.path.join(os.getcwd(), "ckpt")
    x = np.random.default_rng(0).random((256, 4), dtype=np.float32); y = x.sum(axis=1, keepdims=True)
    def model_fn():
        m = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
        m.compile(tf.keras.optimizers.SGD(0.01), "mse", metrics=["mae"])
        return m
    os.environ["TFCLUSTER_TASK_TYPE"] = "chief"
    trained = model_fn()
    save = tf.keras.callbacks.ModelCheckpoint(os.path.join(ckpt, "ckpt-{epoch}"), save_weights_only=True)
    trained.fit(x, y, batch_size=32, epochs=2, validation_data=(x, y), callbacks=[save], verbose=0)
    os.environ["TFCLUSTER_TASK_TYPE"] = "evaluator"
    model = model_fn()
    seen = []
    class Said(tf.keras.callbacks.Callback):
        def on_test_end(self, logs=None):
            seen.append({k: float(v) for k, v in logs.items()})
    tf.keras.utils.SidecarEvaluator(model, data=tf.data.Dataset.from_tensor_slices((x, y)).batch(32),
                                    checkpoint_dir=ckpt, max_evaluations=2, callbacks=[Said()]).start()
    custom = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    print(json.dumps({"sidecar": seen, "custom": custom, "step": int(model.optimizer.iterations.numpy())}))
    """
)


def test_sidecar_evaluator_and_a_custom_evaluate_report_what_keras_returned(tmp_path):
    """Real TensorFlow: a SidecarEvaluator evaluates the last checkpoint, then the script calls evaluate
    itself; each is one record with the metrics Keras handed its callbacks / returned, and the step."""
    env = base_env(TFCLUSTER_INSTRUMENT="1")
    rc, out, err, records = run_python(SIDECAR_SCRIPT + "\n", env, cwd=tmp_path, timeout=300)
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    evals = [r for r in records if r["kind"] == "evaluation"]  # (fit's validation in the chief: none)
    assert [e["source"] for e in evals] == ["sidecar", "evaluate"] and [e["count"] for e in evals] == [1, 2]
    sidecar, custom = evals
    assert sidecar["checkpoint"].endswith("ckpt-2") and sidecar["step"] == result["step"] == 16  # 2 epochs x 8 steps
    assert sidecar["metrics"] == pytest.approx(result["sidecar"][0]) and set(sidecar["metrics"]) == {"loss", "mae"}
    assert custom["metrics"] == pytest.approx(result["custom"]) and "checkpoint" not in custom
    assert tfcluster_lines(err) == []


KERAS3_SCRIPT = textwrap.dedent(
    """
    import json, os
    import numpy as np
    os.environ["TFCLUSTER_TASK_TYPE"] = "evaluator"
    import keras
    x = np.random.default_rng(0).random((64, 4), dtype=np.float32); y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    model.fit(x, y, epochs=1, batch_size=16, validation_data=(x, y), verbose=0)
    print(json.dumps(model.evaluate(x, y, verbose=0, return_dict=True)))
    """
)


def test_keras3_evaluate_in_an_evaluator_task_is_reported_too(tmp_path):
    env = {**base_env(TFCLUSTER_INSTRUMENT="1"), "TF_USE_LEGACY_KERAS": "0"}
    rc, out, err, records = run_python(KERAS3_SCRIPT, env, cwd=tmp_path, timeout=300)
    assert rc == 0, err[-3000:]
    (e,) = [r for r in records if r["kind"] == "evaluation"]  # fit's validation is not one
    assert e["metrics"] == pytest.approx(json.loads(out.strip().splitlines()[-1])) and e["step"] == 4
    assert tfcluster_lines(err) == []
