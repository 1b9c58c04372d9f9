"""What one step all-reduces, as the step clock reports it (tests/test_predict_gradbytes.py).

Real TensorFlow in one process, the step clock's own test harness (``stamp_cases``: two replicas on
two logical CPUs reducing with MWMS's ``CollectiveAllReduce``): Keras ``fit`` and a custom loop of
``stamp_cases.model_of`` (Dense 10→16→1: 193 float32 parameters), a custom loop with a float64
variable and an explicit ``bytes_per_pack``, and the embedding loop (IndexedSlices). Prints
``RESULT {case: window record}``.

    python tests/workloads/grad_bytes_cases.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def solo_fit(steps: int = 30) -> dict:
    """A one-worker MultiWorkerMirroredStrategy (no TF_CONFIG: one CPU replica), Keras ``fit`` of
    Dense 10→16→1 with ``TFCLUSTER_STEPCLOCK=force``: TF reduces nothing, each run is a step."""
    import os

    os.environ["TFCLUSTER_STEPCLOCK"] = "force"
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf

    from worker_entry.instrument import hooks as instrument
    from worker_entry.instrument.stepclock import reader as stampreader

    instrument.install()
    s = tf.distribute.MultiWorkerMirroredStrategy()
    records: list[dict] = []
    counted: list[tuple[int, int | None]] = []
    reader = stampreader.Reader(
        1e-6, min_steps=4, emit=lambda kind, **kw: records.append(kw), count=lambda n, ex, at: counted.append((n, ex))
    )
    rng = np.random.default_rng(3)
    x = rng.random((1024, 10), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).repeat().batch(32)
    with s.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input((10,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
    reader.poll(final=True)
    rec = reader.last_record or {}
    return {"counted": sum(n for n, _ in counted), "examples": sum(e or 0 for _, e in counted), **rec}


def packed_loop(s, steps: int = 12) -> tuple[list[float], list]:
    """Dense 10→300 (float32) + Dense 300→1 (float32) + a (3, 5) float64 scale: the gradients
    all-reduced from the replica context: the 4 float32 ones with ``bytes_per_pack=1000`` (3 packs),
    the float64 one in a second all-reduce (one pack)."""
    ds = s.experimental_distribute_dataset(sc.data())
    keras.utils.set_random_seed(7)
    with s.scope():
        model = keras.Sequential([keras.layers.Input((10,)), keras.layers.Dense(300), keras.layers.Dense(1)])
        extra = tf.Variable(tf.ones((3, 5), tf.float64))
        opt = keras.optimizers.SGD(0.01)
    variables = [*model.trainable_variables, extra]
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1000)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True) * tf.cast(tf.reduce_mean(extra), tf.float32)
            loss = tf.reduce_mean((pred - y) ** 2)
        grads = tape.gradient(loss, variables)
        ctx = tf.distribute.get_replica_context()
        # one all-reduce concatenates its tensors (per pack): one dtype each, so the float64 one apart
        grads = [
            *ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads[:-1], options=options),
            ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads[-1]),
        ]
        opt.apply_gradients(zip(grads, variables, strict=True), skip_gradients_aggregation=True)
        return loss

    @tf.function
    def train_step(batch):
        per = s.run(step_fn, args=batch)
        return s.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    it = iter(ds)
    losses = [float(train_step(next(it))) for _ in range(steps)]
    return losses, [train_step]


def main() -> int:
    global sc, tf, keras
    if sys.argv[1:] == ["solo"]:
        print("RESULT " + json.dumps(solo_fit()), flush=True)
        return 0
    import stamp_cases as sc  # sets up TensorFlow, two logical CPUs and the hooks

    tf, keras = sc.tf, sc.keras
    sc.CASES["packed loop"] = packed_loop
    out = {}
    for name in ("fit", "loop", "loop embedding", "packed loop"):
        rec = sc.run(name, True)["record"] or {}
        out[name] = {
            k: v for k, v in rec.items() if k.startswith("grad_") or k in ("bytes_per_pack", "allreduce_impl", "steps")
        }
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
