"""The step clock's stamps in real TensorFlow, one process, every way of training (tests/test_stepclock.py).

Two replicas on two logical CPUs under a MirroredStrategy that reduces with MWMS's own
``CollectiveAllReduce`` (the cross-device ops a multi-worker MWMS uses, and MWMS's base class; one
process cannot build a multi-worker MWMS with two replicas), ``TFCLUSTER_STEPCLOCK=1``. Each case
trains with the stamps and without them (same seed) and reports the losses, the rows delivered, the steps the timeline found and one window's record.

    python tests/workloads/stamp_cases.py [CASE ...]      # prints RESULT {...}
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TFCLUSTER_STEPCLOCK", "1")

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
from tensorflow.python.distribute import collective_util, cross_device_utils  # noqa: E402
from tensorflow.python.distribute import cross_device_ops as cdo  # noqa: E402

from worker_entry.instrument import hooks as instrument  # noqa: E402
from worker_entry.instrument.stepclock import collectives, stamps  # noqa: E402
from worker_entry.instrument.stepclock import reader as stampreader  # noqa: E402
from worker_entry.instrument.stepclock import ring as stampring  # noqa: E402

instrument.install()  # the hooks (TensorFlow's distribute modules are imported already: patched at once)
keras = tf.keras
DEVICES = ["/cpu:0", "/cpu:1"]
NEXT_MS: list[float] = []  # the custom loop's own timing of each eager next(): the input wait it saw
KEYS = cross_device_utils.CollectiveKeys()  # shared: strategies of one process must not reuse instance keys


def strategy(n: int = 2) -> tf.distribute.Strategy:
    devices = DEVICES[:n]
    ops = cdo.CollectiveAllReduce(devices, len(devices), collective_util.Options(), collective_keys=KEYS)
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


def data(n: int = 1024, features: int = 10, seed: int = 3, repeat: bool = True) -> tf.data.Dataset:
    """Batches of 32 without ``drop_remainder`` (as the tutorials batch): no static batch dimension."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, features), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))
    return (ds.repeat() if repeat else ds).batch(32)


def model_of(s: tf.distribute.Strategy, embedding: bool = False) -> keras.Model:
    keras.utils.set_random_seed(7)
    with s.scope():
        if embedding:
            layers = [keras.layers.Input((10,)), keras.layers.Embedding(50, 4), keras.layers.Flatten()]
        else:
            layers = [keras.layers.Input((10,)), keras.layers.Dense(16, activation="relu")]
        return keras.Sequential([*layers, keras.layers.Dense(1)])


def sleep_op(ms: float, x: tf.Tensor) -> tf.Tensor:
    """A py_function that sleeps ``ms`` and returns ``x`` (a reproducible delay inside the graph)."""

    def f(v):
        time.sleep(ms / 1000.0)
        return v

    return tf.ensure_shape(tf.py_function(f, [x], x.dtype), x.shape)


def custom_loop(
    s,
    steps=24,
    *,
    inside=False,
    accum=1,
    together=False,
    two_opts=False,
    legacy=False,
    embedding=False,
    input_ms=0.0,
    compute_ms=0.0,
    after_ms=0.0,
    host_ms=0.0,
):
    """The MWMS custom loop the way TF's tutorials write it: strategy.run over a distributed dataset,
    tape.gradient, optimizer.apply_gradients, strategy.reduce of the loss."""
    ds = data()
    if embedding:
        ds = ds.map(lambda x, y: (tf.cast(x * 49, tf.int32), y))
    if input_ms:
        ds = ds.map(lambda x, y: (sleep_op(input_ms, x), y))
    dist = s.experimental_distribute_dataset(ds)
    model = model_of(s, embedding)
    with s.scope():
        opt = keras.optimizers.legacy.SGD(0.05) if legacy else keras.optimizers.SGD(0.05)
        opt2 = keras.optimizers.SGD(0.01) if two_opts else None
        acc = [
            tf.Variable(
                tf.zeros_like(v),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
            for v in model.trainable_variables
        ]
    variables = model.trainable_variables

    def grads_of(x, y):
        with tf.GradientTape() as tape:
            if compute_ms:
                x = x + 0.0 * sleep_op(compute_ms, x)
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        return loss, tape.gradient(loss, variables)

    def apply(grads):
        if two_opts:
            opt.apply_gradients(zip(grads[:2], variables[:2], strict=True))
            opt2.apply_gradients(zip(grads[2:], variables[2:], strict=True))
        else:
            opt.apply_gradients(zip(grads, variables, strict=True))
        if after_ms:  # reads an updated variable: runs after the update (automatic control dependencies)
            sleep_op(after_ms, tf.reduce_sum(variables[-1].read_value()))

    def step_fn(x, y):
        loss, grads = grads_of(x, y)
        if accum == 1:
            apply(grads)
        else:  # gradient accumulation: every k-th step another function applies (and all-reduces)
            for a, g in zip(acc, grads, strict=True):
                a.assign_add(g)
        return loss

    def apply_fn():
        apply([a.read_value() / accum for a in acc])
        for a in acc:
            a.assign(tf.zeros_like(a))

    @tf.function
    def train_step(batch):
        losses = s.run(lambda b: step_fn(*b), args=(batch,))
        return s.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    @tf.function
    def train_from(iterator):
        return train_step.python_function(next(iterator))

    @tf.function
    def apply_step():
        s.run(apply_fn)

    @tf.function
    def train_together(*batches):  # the micro-batches of an optimizer step in one replica function
        losses = s.run(lambda *bs: tf.add_n([step_fn(*b) for b in bs]), args=batches)
        return s.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    it = iter(dist)
    losses = []
    if together:
        for _ in range(steps):
            losses.append(round(float(train_together(*[next(it) for _ in range(accum)])), 6))
            apply_step()
        return losses, [train_together, apply_step]
    NEXT_MS.clear()
    for i in range(steps * accum):
        if inside:
            loss = train_from(it)
        else:
            t0 = time.perf_counter()
            batch = next(it)
            NEXT_MS.append((time.perf_counter() - t0) * 1e3)
            loss = train_step(batch)
        if accum > 1 and (i + 1) % accum == 0:
            apply_step()
        if host_ms:
            time.sleep(host_ms / 1000.0)
        losses.append(round(float(loss), 6))
    fns = [train_step] + ([train_from] if inside else []) + ([apply_step] if accum > 1 else [])
    return losses, fns


def keras_fit(s, *, spe=1, legacy=False, jit=False, steps=24, finite=0):
    """``finite``: a dataset of that many examples, each epoch to its end (the last batch partial)."""
    model = model_of(s)
    with s.scope():
        opt = keras.optimizers.legacy.SGD(0.05) if legacy else keras.optimizers.SGD(0.05)
        model.compile(opt, "mse", steps_per_execution=spe, jit_compile=jit)
    if finite:
        h = model.fit(data(finite, repeat=False), epochs=2, verbose=0)
        return [round(x, 6) for x in h.history["loss"]], [model.train_tf_function]
    h = model.fit(data(), epochs=2, steps_per_epoch=steps // 2, verbose=0)
    return [round(x, 6) for x in h.history["loss"]], [model.train_tf_function]


CASES = {
    "loop": lambda s: custom_loop(s),
    "loop next inside": lambda s: custom_loop(s, inside=True),
    "loop legacy optimizer": lambda s: custom_loop(s, legacy=True),
    "loop embedding": lambda s: custom_loop(s, embedding=True),
    "loop two optimizers": lambda s: custom_loop(s, two_opts=True),
    "loop accumulation": lambda s: custom_loop(s, accum=4, steps=8),
    "loop accumulation together": lambda s: custom_loop(s, accum=4, steps=8, together=True),
    "fit": lambda s: keras_fit(s),
    "fit 3 per execution": lambda s: keras_fit(s, spe=3),
    "fit legacy optimizer": lambda s: keras_fit(s, legacy=True),
    "fit partial batches": lambda s: keras_fit(s, finite=101),  # 3 x 32 + 5 per epoch: 3 + 2 on the replicas
    "fit jit": lambda s: keras_fit(strategy(1), jit=True, steps=8),  # XLA on CPU: one device
    # 2 replicas: their compute and after sleeps run one after the other (stateful ops in program order)
    # input: 120 ms, well over the rest of the step even on a loaded box, so the wait stays in sight
    "delays": lambda s: custom_loop(s, steps=16, input_ms=120, compute_ms=5, after_ms=5, host_ms=10),
}


def keras3_fit(s, steps=24):
    import keras  # Keras 3 (tf.keras is tf_keras here): its own trainer, its own optimizers

    keras.utils.set_random_seed(7)
    with s.scope():
        model = keras.Sequential([keras.layers.Input((10,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    h = model.fit(data(), epochs=2, steps_per_epoch=steps // 2, verbose=0)
    return [round(x, 6) for x in h.history["loss"]], []


CASES["keras 3 fit"] = keras3_fit


def graph_facts(fns) -> dict:
    """Our ops in the traced graphs: stamps chained to other stamps beyond the designed edges
    (t_data after t_start, t_done after the exits; must be none) and, for synced stamps, how
    ``t_enter`` waits for the gradients: through a host copy of a slice made after them."""
    chained, d2h, enter, batch = [], [], [], []
    for f in fns:
        for cf in f._list_all_concrete_functions():
            for op in cf.graph.get_operations():
                if op.type == "Shape" and "tfcluster_batch/" in op.name:
                    # the batch dimension is read where the batch is (no copy of it, no wait for a kernel)
                    batch.append(op.colocation_groups() == op.inputs[0].op.colocation_groups())
                if op.type != "Timestamp":
                    continue
                stamps_before = [c.name for c in op.control_inputs if c.type == "Timestamp"]
                allowed = ("t_start",) if "t_data" in op.name else ("t_exit",) if "t_done" in op.name else ()
                chained += [c for c in stamps_before if not any(a in c for a in allowed)]
                copies = [c for c in op.control_inputs if c.name.endswith("tfcluster_d2h")]
                d2h += copies
                if "t_enter" in op.name and copies:
                    copy = copies[0]
                    sliced = copy.inputs[0].op
                    waits, frontier = set(), [sliced]
                    for _ in range(4):  # control deps sit on the first op made under them (a shape constant)
                        waits |= {c.name for o in frontier for c in o.control_inputs}
                        frontier = [i.op for o in frontier for i in o.inputs]
                    enter.append(
                        {
                            "copy_device": copy.device,
                            "slice": sliced.type,
                            "waits_for_gradients": any("gradient_tape" in w for w in waits),
                        }
                    )
    return {"chained": chained, "d2h_stamps": len(d2h), "enter_sync": enter[:2], "batch_colocated": batch}


def run(name: str, clock: bool, fail: str | None = None, sync: bool = False) -> dict:
    os.environ["TFCLUSTER_STEPCLOCK"] = "1" if clock else "0"
    os.environ["TFCLUSTER_STAMP_SYNC"] = "1" if sync else "0"
    module = collectives if fail in ("_enter", "_exit") else stamps
    saved = getattr(module, fail) if fail else None
    if fail:

        def boom(*a, **k):
            raise RuntimeError("injected " + fail)

        setattr(module, fail, boom)
    stampring.drain()
    stampring.take_inputs()
    NEXT_MS.clear()
    n0 = stampring.delivered()
    records: list[dict] = []
    counted: list[tuple[int, int | None]] = []
    reader = stampreader.Reader(
        1e-6, min_steps=4, emit=lambda kind, **kw: records.append(kw), count=lambda n, ex, at: counted.append((n, ex))
    )
    try:
        losses, fns = CASES[name](strategy())
    finally:
        if fail:
            setattr(module, fail, saved)
    reader.poll()
    rows = stampring.delivered() - n0
    return {
        "losses": losses,
        "rows": rows,
        "steps": sum(n for n, _ in counted),
        "examples": None if any(ex is None for _, ex in counted) else sum(ex for _, ex in counted),
        "record": reader.last_record,
        "next_ms": [round(x, 3) for x in NEXT_MS],
        "graph": graph_facts(fns) if clock else {},
    }


def main(names: list[str]) -> int:
    out = {}
    for name in names or list(CASES):
        out[name] = {"on": run(name, True), "off": run(name, False)}
    extra = os.environ.get("STAMP_CASES_EXTRA", "")
    if "fail" in extra:
        for fail in ("_enter", "_exit", "_begin_run", "_end_run"):
            out[f"loop fail {fail}"] = {"on": run("loop", True, fail=fail)}
    if "sync" in extra:
        out["loop synced"] = {"on": run("loop", True, sync=True)}
        out["fit synced"] = {"on": run("fit", True, sync=True)}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
