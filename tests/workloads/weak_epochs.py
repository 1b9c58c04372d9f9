"""Weak scaling the way TF's Keras tutorials write it: the global batch is the per-worker batch times the
workers, and each epoch is one pass over a finite dataset batched *without* drop_remainder, so every
epoch ends in a partial batch (6,000 examples in global batches of 192 at 3 workers: 31 of 192 and one of
48). Plain TensorFlow, nothing of tfcluster.

    python tests/workloads/weak_epochs.py [--examples 6000] [--per-worker-batch 64] [--epochs 100000]
"""

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=6000)
    p.add_argument("--per-worker-batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=100000)
    args = p.parse_args()
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = len(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker", [])) or 1
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, 16)).astype("float32")
    y = x[:, :1] * 2.0
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.per_worker_batch * workers)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((16,)), tf.keras.layers.Dense(32), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(ds, epochs=args.epochs, verbose=0)


if __name__ == "__main__":
    main()
