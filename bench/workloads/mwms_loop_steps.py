"""A plain MWMS custom training loop that reports its own throughput. Plain TensorFlow: no tfcluster import.

    python bench/workloads/mwms_loop_steps.py --warmup-epochs 2 --epochs 8 --steps 100

The same model, data and batch as bench/workloads/mwms_steps.py (Dense 32-64-1, batch 64 per worker),
trained the way TensorFlow's tutorials write a custom loop: ``strategy.run`` over
``experimental_distribute_dataset``, ``tape.gradient``, ``optimizer.apply_gradients``,
``strategy.reduce`` of the loss. After the warm-up epochs every epoch's wall time is measured; at the
end each task prints one line ``RESULT {"task": ..., "steps_per_s": ..., "steps": ..., "seconds": ...}``
and one line per epoch ``TASK: epoch N S steps/s`` (the format bench/overhead.py reads).

``--ab ROUNDS``: under tfcluster's instrumentation, the step is traced twice — with the step clock's
stamps and without (``TFCLUSTER_STEPCLOCK`` at trace time) — and the two alternate in blocks of 20 steps
(order reversed every round, the first 5 steps of a block not timed) inside this one job, so load
drift on a shared machine hits both alike; prints ``AB {"task", "on_ms", "off_ms", "ratio"}`` (median
step times, steps/s on ÷ off).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ab", type=int, default=0, help="rounds of the in-job stamps on/off alternation")
    args = p.parse_args()
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = f"{cfg['task']['type']}:{cfg['task']['index']}" if cfg else "local"
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64 * workers, drop_remainder=True)
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input((32,)), tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)]
        )
        optimizer = tf.keras.optimizers.Adam()

    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(features, training=True) - labels), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=64 * workers)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(batch,)), axis=None)

    if args.ab:
        return alternate(tf, task, step_fn, strategy, iterator, args.ab)
    measured = []
    for epoch in range(args.warmup_epochs + args.epochs):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = train_step(next(iterator))
        float(loss)
        dt = time.perf_counter() - t0
        if epoch >= args.warmup_epochs:
            measured.append(dt)
        print(f"{task}: epoch {epoch} {args.steps / dt:.1f} steps/s", flush=True)
    secs = sum(measured)
    steps = args.steps * len(measured)
    print(
        "RESULT " + json.dumps({"task": task, "steps_per_s": steps / secs, "steps": steps, "seconds": secs}), flush=True
    )
    return 0


def alternate(tf, task, step_fn, strategy, iterator, rounds: int, block: int = 20, skip: int = 5) -> int:
    import statistics

    variants = {}
    for name, clock in (("on", "auto"), ("off", "0")):
        os.environ["TFCLUSTER_STEPCLOCK"] = clock  # read while tracing: one function with stamps, one without

        @tf.function
        def train_step(batch):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(batch,)), axis=None)

        float(train_step(next(iterator)))
        variants[name] = train_step
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
            f = variants[name]
            for i in range(block):
                t0 = time.perf_counter()
                float(f(next(iterator)))
                if i >= skip:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(
        "AB " + json.dumps({"task": task, "on_ms": round(on, 3), "off_ms": round(off, 3), "ratio": round(off / on, 4)}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
