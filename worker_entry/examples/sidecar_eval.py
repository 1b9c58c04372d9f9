"""Demo: MultiWorkerMirroredStrategy training with Keras ``fit`` and a sidecar evaluator, the way
TensorFlow's docs pair them.

    python -m worker_entry.examples.sidecar_eval --epochs 3 [--steps-per-epoch 20] [--epoch-sleep-s 0]

One script for every role (``TF_CONFIG``'s task type decides). ``chief``/``worker``: train under MWMS
and write a checkpoint per epoch (``ModelCheckpoint(save_weights_only=True)``) into
``TFCLUSTER_CHECKPOINT_DIR``. ``evaluator``: ``tf.keras.utils.SidecarEvaluator`` watches that
directory and evaluates each checkpoint as it appears (it is not a member of the collective: its
TF_CONFIG's cluster does not list it), up to ``--epochs`` evaluations, then ends — or is stopped when
the training ended. ``--epoch-sleep-s``: pause after each epoch (a longer run, for fault tests).
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
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epoch-sleep-s", type=float, default=0.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = (json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")) or {}
    kind = task.get("type")
    ckpt_dir = os.environ.get("TFCLUSTER_CHECKPOINT_DIR") or "/tmp/sidecar-eval-ckpt"
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((1024, 10), dtype=np.float32)
    y = (x @ rng.random((10, 1), dtype=np.float32)).astype(np.float32)

    def model_fn():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input((10,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
        return model

    if kind == "evaluator":
        model = model_fn()
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)
        print(f"[evaluator:0] evaluating every checkpoint in {ckpt_dir}", flush=True)

        class Said(tf.keras.callbacks.Callback):
            def on_test_end(self, logs=None):
                step = int(model.optimizer.iterations.numpy())
                shown = " ".join(f"{k} {v:.4f}" for k, v in (logs or {}).items())
                print(f"[evaluator:0] evaluated the checkpoint of step {step}: {shown}", flush=True)

        tf.keras.utils.SidecarEvaluator(
            model, data=data, checkpoint_dir=ckpt_dir, steps=4, max_evaluations=args.epochs, callbacks=[Said()]
        ).start()
        print("[evaluator:0] done", flush=True)
        return 0

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = model_fn()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)

    class Pause(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if args.epoch_sleep_s:
                time.sleep(args.epoch_sleep_s)

    save = tf.keras.callbacks.ModelCheckpoint(os.path.join(ckpt_dir, "ckpt-{epoch}"), save_weights_only=True)
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[save, Pause()], verbose=2)
    print(f"[{kind}:{task.get('index', 0)}] training done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
