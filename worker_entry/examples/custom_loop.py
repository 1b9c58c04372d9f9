"""Demo: a plain MWMS custom training loop, the way TensorFlow's tutorials write it.

    python -m worker_entry.examples.custom_loop --steps 500 [--batch-size 64] [--accum 1]
        [--slow-task worker:1 --slow-input-ms 60 --slow-after-s 10] [--extra-matmuls 0]
        [--hang-task worker:2 --hang-after-steps 100] [--next-inside] [--log-every 100]

``strategy.run`` over ``experimental_distribute_dataset``, ``tape.gradient``,
``optimizer.apply_gradients``, ``strategy.reduce`` of the loss. It uses nothing from tfcluster: under
tfcluster's instrumentation it reports steps, progress and straggler signals all the same.

``--accum K``: gradient accumulation — K micro-batches per optimizer step; only every K-th call
all-reduces (a second ``tf.function`` applies the accumulated gradients). ``--slow-input-ms N``: the
input pipeline of ``--slow-task`` (every task if omitted) sleeps N ms per batch, from ``--slow-after-s``
seconds into training. ``--extra-matmuls N``: N extra 256x256 matmuls per step on ``--slow-task``.
``--hang-task T --hang-after-steps N``: T stops stepping (sleeps) after N steps, its peers wait in the
next all-reduce. ``--next-inside``: the iterator goes into the ``tf.function`` (``next()`` inside it).
``--together`` (with ``--accum K``): the K micro-batches go to one ``strategy.run`` as K arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 breaks multi-worker MWMS in TF 2.21


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--slow-task", default="")
    p.add_argument("--slow-input-ms", type=float, default=0.0)
    p.add_argument("--slow-after-s", type=float, default=0.0)
    p.add_argument("--extra-matmuls", type=int, default=0)
    p.add_argument("--hang-task", default="")
    p.add_argument("--hang-after-steps", type=int, default=0)
    p.add_argument("--next-inside", action="store_true")
    p.add_argument("--together", action="store_true", help="--accum K: the K micro-batches in one strategy.run")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = f"{cfg['task']['type']}:{cfg['task']['index']}" if cfg.get("task") else "local"
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = max(1, strategy.num_replicas_in_sync)
    here = not args.slow_task or args.slow_task == task
    tf.keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x = rng.random((4096, 10), dtype=np.float32)
    y = (x @ rng.random((10, 1), dtype=np.float32)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size * workers, drop_remainder=True)
    if args.slow_input_ms > 0 and here:
        state = {"t0": None, "said": False}

        def slow(v):
            now = time.time()
            state["t0"] = state["t0"] or now
            if now - state["t0"] >= args.slow_after_s:
                if not state["said"]:
                    state["said"] = True
                    print(f"[{task}] input pipeline slowed by {args.slow_input_ms:g} ms/batch from now", flush=True)
                time.sleep(args.slow_input_ms / 1000.0)
            return v

        ds = ds.map(lambda a, b: (tf.ensure_shape(tf.py_function(slow, [a], tf.float32), a.shape), b))
    dist = strategy.experimental_distribute_dataset(ds.prefetch(1))
    matmuls = args.extra_matmuls if here else 0

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input((10,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(1),
            ]
        )
        optimizer = tf.keras.optimizers.SGD(0.01)
        accumulated = [
            tf.Variable(
                tf.zeros_like(v),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
            for v in model.trainable_variables
        ]

    def gradients(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            pred = model(features, training=True)
            if matmuls:
                a = tf.eye(256) * 0.5
                for _ in range(matmuls):
                    a = tf.tanh(tf.matmul(a, a) + 0.1)
                pred += 0.0 * tf.reduce_mean(a)
            per_example = tf.reduce_mean(tf.square(pred - labels), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size * workers)
        return loss, tape.gradient(loss, model.trainable_variables)

    def step_fn(inputs):
        loss, grads = gradients(inputs)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def accumulate_fn(inputs):
        loss, grads = gradients(inputs)
        for a, g in zip(accumulated, grads, strict=True):
            a.assign_add(g / args.accum)
        return loss

    def apply_fn():
        optimizer.apply_gradients(zip([a.read_value() for a in accumulated], model.trainable_variables, strict=True))
        for a in accumulated:
            a.assign(tf.zeros_like(a))

    fn = step_fn if args.accum == 1 else accumulate_fn

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(fn, args=(batch,)), axis=None)

    @tf.function
    def train_step_inside(iterator):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(fn, args=(next(iterator),)), axis=None)

    def accumulate_all(*micro_batches):
        return tf.add_n([accumulate_fn(b) for b in micro_batches])

    @tf.function
    def train_together(*batches):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(accumulate_all, args=batches), axis=None)

    @tf.function
    def apply_step():
        strategy.run(apply_fn)

    iterator = iter(dist)
    t0 = time.perf_counter()
    loss = tf.constant(0.0)
    for step in range(1, args.steps + 1):
        if task == args.hang_task and step > args.hang_after_steps:
            print(f"[{task}] hanging after {args.hang_after_steps} steps", flush=True)
            time.sleep(3600)
        if args.together and args.accum > 1:
            loss = train_together(*[next(iterator) for _ in range(args.accum)])
        for _ in range(0 if args.together and args.accum > 1 else args.accum):
            loss = train_step_inside(iterator) if args.next_inside else train_step(next(iterator))
        if args.accum > 1:
            apply_step()
        if step % args.log_every == 0 or step == args.steps:
            print(f"[{task}] step {step}/{args.steps} loss={float(loss):.4f}", flush=True)
    print(f"[{task}] done: {args.steps} steps in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
