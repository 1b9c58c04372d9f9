"""A custom MWMS training loop that saves when asked to stop (Slurm's time limit or preemption, Ctrl-C,
`tfcluster stop`) and resumes from that save.

    python -m worker_entry.examples.preemptible_loop --steps 2000

tfcluster asks a task to stop with SIGTERM and waits ``job.stop_grace_s`` before SIGKILL. In a
multi-worker job TensorFlow catches that SIGTERM itself (its coordination service's preemption
notifier) for ``tf.distribute.experimental.PreemptionCheckpointHandler``: ``handler.run(step)`` then
saves a checkpoint at a step every worker agrees on and exits. The checkpoint goes to
``$TFCLUSTER_BACKUP_DIR`` (the chief's is the real one; the handler gives the others temporary
directories), and the next launch — a requeued Slurm job, a restart — restores it when the handler
is created. Plain TensorFlow and the environment tfcluster sets: nothing of tfcluster is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000, help="train until the global step reaches this")
    p.add_argument("--print-every", type=int, default=20)
    args = p.parse_args(argv)
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = "{type}:{index}".format(**config["task"]) if config else "local"

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input(shape=(8,)), tf.keras.layers.Dense(16), tf.keras.layers.Dense(1)]
        )
        optimizer = tf.keras.optimizers.SGD(0.01)
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    backup = os.environ.get("TFCLUSTER_BACKUP_DIR") or "/tmp/custom-loop-backup"
    # Restores the last save (if any) now; from here on, a SIGTERM means: save at an agreed step, exit.
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, checkpoint_dir=backup
    )
    print(f"{task}: starting at step {int(step.numpy())}", flush=True)

    x = tf.random.stateless_normal((64, 8), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True)

    @tf.function
    def train_step() -> None:
        def replica() -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(replica)
        step.assign_add(1)

    while int(step.numpy()) < args.steps:
        handler.run(train_step)
        if int(step.numpy()) % args.print_every == 0:
            print(f"{task}: step {int(step.numpy())}", flush=True)
    print(f"{task}: done at step {int(step.numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
