"""Demo: a ParameterServerStrategy job with a custom ``ClusterCoordinator`` loop, the shape of
TensorFlow's parameter-server training tutorial.

    python -m worker_entry.examples.ps_coordinator --steps 200 [--log-every 20] [--step-ms 0]

One script for every role (``TF_CONFIG``'s task type decides): ``worker`` and ``ps`` tasks start a
``tf.distribute.Server`` and wait for the coordinator's work — they never exit by themselves; the
``chief`` builds the strategy and the coordinator, schedules ``--steps`` training steps over the
workers (the coordinator reschedules the steps of a worker that died, and uses it again once it is
back) and exits 0 when they are done. It reports its steps with ``worker_entry.progress.report_step``
(``--plain``: it does not, as the TF tutorial is written: the instrumentation counts its schedules).
``--step-ms``: each step sleeps that long on its worker (a slower run, for fault tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps the coordinator schedules")
    p.add_argument("--log-every", type=int, default=20, help="steps per scheduled batch and log line")
    p.add_argument("--batch-size", type=int, default=32, help="per-step batch size")
    p.add_argument("--step-ms", type=float, default=0.0, help="sleep this long in each step (on the worker)")
    p.add_argument("--plain", action="store_true", help="no report_step: the TF tutorial's loop as written")
    return p.parse_args(argv)


def serve(task_type: str, index: int) -> int:
    """A worker or ps: a gRPC server the coordinator drives; runs until it is stopped."""
    import tensorflow as tf

    # TF's tutorial: fail fast on a lost peer instead of retrying inside the server.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task_type, task_index=index, protocol=resolver.rpc_layer or "grpc", start=True
    )
    print(f"[{task_type}:{index}] server up at {server.target}", flush=True)
    server.join()
    return 0


def coordinate(args: argparse.Namespace) -> int:
    import numpy as np
    import tensorflow as tf

    if not args.plain:
        from worker_entry.progress import flush, report_step

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input((10,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)]
        )
        optimizer = tf.keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(0)
    x = rng.random((1024, 10), dtype=np.float32)
    y = (x @ rng.random((10, 1), dtype=np.float32)).astype(np.float32)

    def dataset_fn(_context=None):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    sleep_s = args.step_ms / 1000.0

    @tf.function
    def step(it):
        def replica_fn(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        features, labels = next(it)
        if sleep_s:
            tf.py_function(lambda: __import__("time").sleep(sleep_s), [], [])
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_fn, args=(features, labels)), axis=None)

    done = 0
    while done < args.steps:
        n = min(args.log_every, args.steps - done)
        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(n)]
        coordinator.join()  # steps of a worker that died run again on another (or on it, once it is back)
        done += n
        if not args.plain:  # --plain: the instrumentation counts the coordinator's schedules by itself
            report_step(n, examples=n * args.batch_size)
        print(f"[chief:0] step {done}/{args.steps} loss {float(results[-1].fetch()):.4f}", flush=True)
    if not args.plain:
        flush()  # the last steps, before the process exits (records are written ~4 times a second)
    print("[chief:0] training done", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = (json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")) or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in ("worker", "ps"):
        return serve(kind, index)
    if kind == "chief":
        return coordinate(args)
    print(f"ps_coordinator: task type {kind!r} has nothing to do here (chief, worker or ps)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
