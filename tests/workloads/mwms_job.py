"""MWMS training with fault injection, for end-to-end tests. Plain TensorFlow: no tfcluster import.

--fail-task worker:1 --fail-epoch 1 --fail-code 3   that task exits with that code at that epoch
--fail-raise                                        ... raises instead (a traceback on stderr)
--fail-attempt 0                                    ... only in that attempt (TFCLUSTER_ATTEMPT; default: every one)
--verbose 1                                         Keras' progress bar (fit's verbose; default 0)
--never-start worker:2                              that task sleeps instead of joining MWMS
--busy-start worker:0 --busy-start-s 40             that task spins on a core first (slow to start, as on a loaded box)
--print-pid-file DIR                                every task writes DIR/<task>.pid (for kill tests)
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
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--fail-task", default="")
    p.add_argument("--fail-epoch", type=int, default=1)
    p.add_argument("--fail-code", type=int, default=3)
    p.add_argument("--fail-raise", action="store_true")
    p.add_argument("--verbose", type=int, default=0)
    p.add_argument("--fail-attempt", type=int, default=-1)
    p.add_argument("--never-start", default="")
    p.add_argument("--busy-start", default="")
    p.add_argument("--busy-start-s", type=float, default=40.0)
    p.add_argument("--pid-dir", default="")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--slow-task", default="", help="this task's input pipeline sleeps --slow-ms per batch ...")
    p.add_argument("--slow-ms", type=float, default=60.0)
    p.add_argument("--slow-after-s", type=float, default=0.0, help="... starting this long after training began")
    args = p.parse_args()
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = f"{cfg['task']['type']}:{cfg['task']['index']}" if cfg else "local"
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, task.replace(":", "-") + ".pid"), "w") as f:
            f.write(str(os.getpid()))
    print(f"{task}: starting pid {os.getpid()}", flush=True)
    if task == args.never_start:
        print(f"{task}: sleeping instead of starting MWMS", flush=True)
        time.sleep(3600)
    if task == args.busy_start:
        print(f"{task}: busy for {args.busy_start_s:g}s before starting MWMS", flush=True)
        end = time.monotonic() + args.busy_start_s
        while time.monotonic() < end:
            sum(i * i for i in range(10000))
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    print(f"{task}: strategy ready with {strategy.num_replicas_in_sync} replicas", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
    if task == args.slow_task:
        state = {"t0": None, "announced": False}

        def slow(batch):
            now = time.time()
            if state["t0"] is None:
                state["t0"] = now
            if now - state["t0"] >= args.slow_after_s:
                if not state["announced"]:
                    state["announced"] = True
                    print(f"{task}: input pipeline slowed by {args.slow_ms:g} ms/batch from now", flush=True)
                time.sleep(args.slow_ms / 1000.0)
            return batch

        ds = ds.map(lambda a, b: (tf.ensure_shape(tf.py_function(slow, [a], tf.float32), [None, 32]), b))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")

    class Fault(tf.keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            print(f"{task}: epoch {epoch} begins", flush=True)

        def on_train_batch_end(self, batch, logs=None):
            if args.step_sleep:
                time.sleep(args.step_sleep)
            this_attempt = args.fail_attempt < 0 or os.environ.get("TFCLUSTER_ATTEMPT") == str(args.fail_attempt)
            if task == args.fail_task and this_attempt and self.epoch >= args.fail_epoch and batch == args.steps // 2:
                if args.fail_raise:
                    raise RuntimeError(f"{task}: injected failure in epoch {self.epoch}")
                print(f"{task}: injected failure, exiting with {args.fail_code}", flush=True)
                print(f"{task}: last words on stderr", file=sys.stderr, flush=True)
                os._exit(args.fail_code)

        def on_epoch_end(self, epoch, logs=None):
            print(f"{task}: epoch {epoch} loss {logs['loss']:.4f}", flush=True)

    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps, verbose=args.verbose, callbacks=[Fault()])
    print(f"{task}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
