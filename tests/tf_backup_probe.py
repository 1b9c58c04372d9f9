"""One MWMS worker for tests/test_backup_reshape_tf.py (run as a script; TF_CONFIG from the environment).

``--stop-after K``: train with ``BackupAndRestore`` and leave the process right after epoch K's backup is
saved (a crash that keeps the backup), reporting the weights. Without it: resume from the backup and report
the epoch ``fit`` resumes at and the weights as restored, before any step of this run. The global batch
is kept whatever the number of workers (per-worker batch = global / N: the rule in the README).

Prints one JSON line: {"task", "workers", "epoch" (0-based epoch fit starts or stopped at), "weights"
(sha256 of every weight's bytes, in order), "iterations" (the optimizer's step count)}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

GLOBAL_BATCH = 48  # divisible by 2, 3 and 4 workers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backup", required=True)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--stop-after", type=int, default=0)
    args = ap.parse_args()

    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    n = strategy.num_replicas_in_sync
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(11)
    x = rng.random((960, 8), dtype=np.float32)
    y = (x @ rng.random((8, 1), dtype=np.float32)).astype(np.float32)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        per_worker = ctx.get_per_replica_batch_size(GLOBAL_BATCH)  # global / N
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(per_worker, drop_remainder=True)

    with strategy.scope():
        model = keras.Sequential(
            [keras.layers.Input(shape=(8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")

    def report(epoch: int) -> None:
        h = hashlib.sha256()
        for w in model.get_weights():
            h.update(np.ascontiguousarray(w).tobytes())
        line = {
            "task": f"{task['type']}:{task['index']}",
            "workers": n,
            "epoch": epoch,
            "weights": h.hexdigest(),
            "iterations": int(model.optimizer.iterations.numpy()),
        }
        print(json.dumps(line), flush=True)

    class Probe(keras.callbacks.Callback):
        """After BackupAndRestore in the list: its on_train_begin restored, its on_epoch_end saved."""

        def on_epoch_begin(self, epoch, logs=None):
            if not args.stop_after:
                report(epoch)  # the epoch fit resumes at, the weights as restored
                sys.stdout.flush()
                os._exit(0)

        def on_epoch_end(self, epoch, logs=None):
            if args.stop_after and epoch + 1 == args.stop_after:
                report(epoch + 1)
                sys.stdout.flush()
                os._exit(0)  # a crash right after the backup: BackupAndRestore keeps it

    backup = keras.callbacks.BackupAndRestore(backup_dir=args.backup)
    model.fit(
        strategy.distribute_datasets_from_function(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=5,
        callbacks=[backup, Probe()],
        verbose=0,
    )
    return 1  # never reached: the probe leaves first


if __name__ == "__main__":
    sys.exit(main())
