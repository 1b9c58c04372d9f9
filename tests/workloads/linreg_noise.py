"""Linear regression on Gaussian inputs with Gaussian label noise: a model whose gradient noise scale is
known in closed form, trained with Keras ``fit`` or a custom loop under MWMS (the noise-scale tests and
``bench/time_to_loss.py``). Nothing in it mentions tfcluster.

    python linreg_noise.py [--mode fit|loop] [--steps 300] [--batch 16] [--dim 10] [--sigma 2]
        [--offset 1] [--lr 0] [--scale 1] [--local K] [--seed 0]

The model is y = w·x (no bias), the loss the mean squared error, the data x ~ N(0, diag(s)), y = w*·x + ε,
ε ~ N(0, sigma²), drawn fresh (a dataset of 2^18 examples). At w = w* + δ a per-example gradient is
g = 2(δ·x - ε)x; with isotropic inputs (``--scale 1``) G = 2δ and, by Isserlis' theorem,
E[ggᵀ] = 4((|δ|² + σ²)I + 2δδᵀ), so

    B_simple = tr(Σ)/|G|² = d·(1 + σ²/|δ|²) + 1.

``--lr 0`` keeps the weights at w = 0 (δ = -w*, |δ| = ``--offset``): the noise scale stays where it was
computed. ``--scale S``: input variances spread log-uniformly over [1/S, 1] (an ill-conditioned Hessian,
where B_simple is only a bound). ``--local K``: one process, K logical CPUs, MWMS's CollectiveAllReduce
(no TF_CONFIG needed). Prints one line ``B_SIMPLE <exact>`` first and ``LOSS <step> <loss>`` lines.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("fit", "loop"), default="loop")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16, help="per-replica batch")
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--sigma", type=float, default=2.0, help="label noise standard deviation")
    p.add_argument("--offset", type=float, default=1.0, help="|w*|: the distance of the start from the optimum")
    p.add_argument("--lr", type=float, default=0.0)
    p.add_argument("--scale", type=float, default=1.0, help="condition number of the input covariance")
    p.add_argument("--local", type=int, default=0, help="logical CPU replicas in one process (0: MWMS, TF_CONFIG)")
    p.add_argument("--target", type=float, default=None, help="stop at this loss (mean over --window steps)")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--log-every", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def exact_b_simple(dim: int, sigma: float, offset: float) -> float:
    """B_simple at w = 0 for isotropic inputs: d(1 + sigma²/|delta|²) + 1."""
    return dim * (1 + sigma**2 / offset**2) + 1


def strategy_of(args: argparse.Namespace):
    import tensorflow as tf

    if not args.local:
        return tf.distribute.MultiWorkerMirroredStrategy()
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo

    devices = [f"/cpu:{i}" for i in range(args.local)]
    ops = cdo.CollectiveAllReduce(devices, len(devices), collective_util.Options())
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


def data(args: argparse.Namespace, replicas: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(args.seed + 1)
    w_star = rng.standard_normal(args.dim)
    w_star *= args.offset / np.linalg.norm(w_star)
    var = np.geomspace(1.0 / args.scale, 1.0, args.dim) if args.scale > 1 else np.ones(args.dim)
    x = (rng.standard_normal((1 << 18, args.dim)) * np.sqrt(var)).astype(np.float32)
    y = (x @ w_star + args.sigma * rng.standard_normal(1 << 18)).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1 << 16, seed=args.seed).repeat()
    return ds.batch(args.batch * replicas, drop_remainder=True).prefetch(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    if args.local:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.local)
    print(f"B_SIMPLE {exact_b_simple(args.dim, args.sigma, args.offset):.3f}", flush=True)
    strategy = strategy_of(args)
    replicas = strategy.num_replicas_in_sync
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Input((args.dim,)), tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
        )
        optimizer = tf.keras.optimizers.SGD(args.lr)
    ds = data(args, replicas)
    if args.mode == "fit":
        model.compile(optimizer, "mse")
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)
        print("DONE", flush=True)
        return 0
    dist = iter(strategy.experimental_distribute_dataset(ds))
    global_batch = args.batch * replicas

    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(batch,)), axis=None)

    recent: list[float] = []
    for step in range(1, args.steps + 1):
        loss = float(train_step(next(dist)))
        recent = [*recent[-(args.window - 1) :], loss]
        if args.log_every and step % args.log_every == 0:
            print(f"LOSS {step} {sum(recent) / len(recent):.6f}", flush=True)
        if args.target is not None and len(recent) == args.window and sum(recent) / len(recent) <= args.target:
            print(f"REACHED {step}", flush=True)
            break
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
