"""MWMS training that reports its own throughput. Plain TensorFlow: no tfcluster import.

    python bench/workloads/mwms_steps.py --warmup-epochs 1 --epochs 8 --steps 100

Same model and data as tests/workloads/mwms_job.py (Dense 32-64-1, batch 64 per worker). After the
warm-up epochs, every epoch's wall time is measured (on_epoch_begin -> on_epoch_end); at the end
each task prints one line ``RESULT {"task": ..., "steps_per_s": ..., "steps": ..., "seconds": ...}``.
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
    # Diagnosis (bench/overhead.py --diagnose): apply, by hand, one thing tfcluster's instrumentation does.
    p.add_argument("--comm-impl", default="", help="ring|nccl|auto: pass CommunicationOptions(implementation=...)")
    p.add_argument("--comm-timeout", type=float, default=None, help="CommunicationOptions(timeout_seconds=...)")
    p.add_argument("--coord-heartbeat-s", type=float, default=None, help="pre-configure the coordination service")
    args = p.parse_args()
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = f"{cfg['task']['type']}:{cfg['task']['index']}" if cfg else "local"
    import numpy as np
    import tensorflow as tf

    if args.coord_heartbeat_s is not None:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver
        from tensorflow.python.eager import context

        spec = multi_worker_util.normalize_cluster_spec(
            tfconfig_cluster_resolver.TFConfigClusterResolver().cluster_spec()
        )
        jobs = [
            coordination_config_pb2.CoordinatedJob(name=j, num_tasks=spec.num_tasks(j))
            for j in ("chief", "worker")
            if j in spec.jobs
        ]
        context.context().configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(spec),
            coordinated_jobs=jobs,
            heartbeat_timeout_in_ms=round(args.coord_heartbeat_s * 1000),
        )
    kwargs = {}
    if args.comm_impl or args.comm_timeout is not None:
        impl = getattr(tf.distribute.experimental.CommunicationImplementation, (args.comm_impl or "auto").upper())
        kwargs["communication_options"] = tf.distribute.experimental.CommunicationOptions(
            implementation=impl, timeout_seconds=args.comm_timeout
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(**kwargs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")

    class Timer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = 0.0
            self.measured: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t0
            if epoch >= args.warmup_epochs:
                self.measured.append(dt)
            print(f"{task}: epoch {epoch} {args.steps / dt:.1f} steps/s", flush=True)

    timer = Timer()
    total = args.warmup_epochs + args.epochs
    model.fit(ds, epochs=total, steps_per_epoch=args.steps, verbose=0, callbacks=[timer])
    secs = sum(timer.measured)
    steps = args.steps * len(timer.measured)
    print(
        "RESULT " + json.dumps({"task": task, "steps_per_s": steps / secs, "steps": steps, "seconds": secs}), flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
