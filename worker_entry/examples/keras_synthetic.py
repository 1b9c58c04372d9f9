"""Demo: a small Keras model on synthetic data under a plain MultiWorkerMirroredStrategy.

    python -m worker_entry.examples.keras_synthetic --epochs 3 --steps-per-epoch 50 \
        [--batch-size 64] [--slow-input-ms 0] [--extra-matmuls 0] [--slow-task worker:1] [--backup]

It uses nothing from tfcluster, so it runs alone (one process, no TF_CONFIG), under any MWMS launcher,
and under tfcluster (which adds progress reporting through its instrumentation). Every task prints one
flushed line per epoch. ``--batch-size`` is per worker (the global batch is that times the number of
workers; with ``--backup``, an attempt on fewer workers than planned after a host was lost for good
keeps the planned global batch: ``worker_entry.reshaped_batch_size``). ``--slow-input-ms N`` sleeps N
ms per batch inside a tf.data map, on ``--slow-task`` only (every task if omitted): a reproducible input-bound straggler. ``--extra-matmuls N`` makes the model's
forward pass multiply N extra 256x256 matrices on ``--matmul-task`` (default: ``--slow-task``) only (the
result is added times a zero variable, so the losses do not change): a compute-bound straggler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from worker_entry import reshaped_batch_size, sweep_batch_size  # the public API (worker_entry.instrument.sweep)

# Keras 3 breaks multi-worker model.fit under MWMS in TF 2.21 (keras-team/keras#20585): use tf_keras
# through tf.keras. The launcher sets this; setting the default here keeps the script runnable alone.
# It must happen before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    p.add_argument("--slow-input-ms", type=float, default=0.0, help="sleep per batch in the input pipeline")
    p.add_argument("--extra-matmuls", type=int, default=0, help="extra 256x256 matmuls per forward pass")
    p.add_argument("--slow-task", default="", help="TYPE:INDEX of the slowed task (default: every task)")
    p.add_argument("--matmul-task", default=None, help="TYPE:INDEX doing the extra matmuls (default: --slow-task)")
    p.add_argument("--steps-per-execution", type=int, default=1, help="model.compile(steps_per_execution=...)")
    p.add_argument("--backup", action="store_true", help="BackupAndRestore into $TFCLUSTER_BACKUP_DIR")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def task_identity() -> tuple[str | None, int, int]:
    """(task type, index, number of workers) from TF_CONFIG; (None, 0, 1) without one."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task") or {}
    cluster = config.get("cluster") or {}
    workers = sum(len(cluster.get(job, [])) for job in ("chief", "worker")) or 1
    return task.get("type"), int(task.get("index", 0)), workers


def is_chief(task_type: str | None, index: int) -> bool:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    has_chief = bool((config.get("cluster") or {}).get("chief"))
    return task_type is None or task_type == "chief" or (task_type == "worker" and index == 0 and not has_chief)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task_type, task_index, num_workers = task_identity()
    task = f"{task_type}:{task_index}" if task_type else "local"

    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    if num_workers > 1 and not str(getattr(keras, "__version__", "2")).startswith("2"):
        print(
            f"error: tf.keras is Keras {keras.__version__}; multi-worker model.fit under "
            "MultiWorkerMirroredStrategy needs the legacy Keras 2 (keras-team/keras#20585). "
            "Install tf_keras matching TensorFlow and set TF_USE_LEGACY_KERAS=1.",
            file=sys.stderr,
            flush=True,
        )
        return 2

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(args.seed)  # same initial weights in every run with this seed
    slow_here = args.slow_input_ms > 0 and (not args.slow_task or args.slow_task == task)
    matmul_task = args.slow_task if args.matmul_task is None else args.matmul_task
    matmuls_here = args.extra_matmuls if (not matmul_task or matmul_task == task) else 0
    rng = np.random.default_rng(args.seed + 1000 * task_index)
    features = rng.random((4096, 10), dtype=np.float32)
    labels = (features @ rng.random((10, 1), dtype=np.float32)).astype(np.float32)

    # Under `tfcluster scale --strong` each worker takes its share of the baseline's global batch; with
    # --backup, resumed on fewer workers than planned, its share of the planned global batch (global / N).
    per_worker_batch = sweep_batch_size(args.batch_size)
    if args.backup:
        per_worker_batch = reshaped_batch_size(per_worker_batch)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
        per_worker = per_worker_batch
        per_replica = ctx.get_per_replica_batch_size(per_worker * ctx.num_replicas_in_sync)
        # A static batch size (drop_remainder on a repeated dataset drops nothing): shapes are known
        # to TensorFlow, and tfcluster's instrumentation can count examples/s from it.
        ds = ds.batch(per_replica, drop_remainder=True)
        if slow_here:
            delay = args.slow_input_ms / 1000.0

            def _sleep(x: tf.Tensor) -> tf.Tensor:
                time.sleep(delay)
                return x

            ds = ds.map(lambda x, y: (tf.ensure_shape(tf.py_function(_sleep, [x], tf.float32), [per_replica, 10]), y))
        return ds.prefetch(1)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)

    class Burn(keras.layers.Layer):
        """Identity with ``n`` extra matmuls (every task builds the layer: MWMS needs the same variables)."""

        def __init__(self, n: int, size: int = 256, **kwargs):
            super().__init__(**kwargs)
            self.n, self.size = n, size

        def build(self, input_shape):
            # A variable, not a constant: grappler must not fold the extra work away.
            self.zero = self.add_weight(name="zero", shape=(), initializer="zeros", trainable=False)

        def call(self, x):
            if self.n <= 0:
                return x
            a = tf.eye(self.size) * (0.5 + self.zero)
            for _ in range(self.n):
                a = tf.tanh(tf.matmul(a, a) + 0.1)
            return x + self.zero * tf.reduce_mean(a)  # == x: zero times a finite value

    with strategy.scope():
        layers = [keras.layers.Input(shape=(10,))]
        if args.extra_matmuls > 0:
            layers.append(Burn(matmuls_here))
        layers += [
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
        model = keras.Sequential(layers)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=args.steps_per_execution)

    class EpochLine(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self._t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            loss = (logs or {}).get("loss", float("nan"))
            print(
                f"[{task}] epoch {epoch + 1}/{args.epochs} loss={float(loss):.4f} "
                f"steps={args.steps_per_epoch} time={time.perf_counter() - self._t0:.2f}s batch={per_worker_batch}",
                flush=True,
            )

    callbacks: list = [EpochLine()]
    backup_tmp = None
    if args.backup:
        backup_dir = os.environ.get("TFCLUSTER_BACKUP_DIR") or ""
        if not backup_dir:
            backup_dir = backup_tmp = tempfile.mkdtemp(prefix="keras-backup-")
        callbacks.append(keras.callbacks.BackupAndRestore(backup_dir=backup_dir))

    t0 = time.perf_counter()
    history = model.fit(
        dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=0
    )
    losses = history.history.get("loss", [])
    print(f"[{task}] done: {len(losses)} epoch(s) in {time.perf_counter() - t0:.1f}s", flush=True)

    ckpt_dir = os.environ.get("TFCLUSTER_CHECKPOINT_DIR")
    if ckpt_dir:
        # Standard MWMS pattern: every task saves (saving can involve collectives), only the chief's
        # copy is real; the others write to a temporary directory and delete it.
        chief = is_chief(task_type, task_index)
        target = ckpt_dir if chief else tempfile.mkdtemp(prefix=f"ckpt-{task_type}-{task_index}-")
        os.makedirs(target, exist_ok=True)
        tf.train.Checkpoint(model=model).write(os.path.join(target, "model"))
        if chief:
            with open(os.path.join(target, "summary.json"), "w") as f:
                json.dump({"epochs": args.epochs, "losses": [float(x) for x in losses]}, f)
            print(f"[{task}] saved checkpoint to {target}", flush=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
    if backup_tmp:
        shutil.rmtree(backup_tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
