"""A Keras ``fit`` under MultiWorkerMirroredStrategy whose gradients are large enough for the network
to matter on rate-limited links (bench/predict_accuracy.py). Plain TensorFlow: no tfcluster import.

    python bench/workloads/predict_model.py --width 768 --batch 32 --epochs 100000

Dense 128 → W → W → 1 (float32): (128·W + W + W·W + W + W + 1) parameters, 4 bytes each. Synthetic
data, per-worker batch ``--batch`` (weak scaling: the global batch grows with the workers).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--batch", type=int, default=32, help="per-worker batch")
    p.add_argument("--epochs", type=int, default=100000)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    args = p.parse_args()
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = len(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker", [])) or 1
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 128)).astype("float32")
    y = x[:, :1].astype("float32")
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch * workers, drop_remainder=True).prefetch(2)
    )
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input((128,)),
                tf.keras.layers.Dense(args.width, activation="relu"),
                tf.keras.layers.Dense(args.width, activation="relu"),
                tf.keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(1e-3), loss="mse")
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
