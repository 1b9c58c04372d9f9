#!/usr/bin/env python3
"""Cost of the step clock's stamps per step, measured inside one process (no cluster, no launcher).

    python bench/stamp_cost.py [--quick] [--json] [--target-ms 10] [--rounds 30] [--gpu]

The same train step (a custom loop: strategy.run, tape.gradient, apply_gradients, strategy.reduce) is
traced four times — stamps off, stamps on (host stamps), stamps on with the GPU completion sync forced
(``TFCLUSTER_STAMP_SYNC=1``: on a CPU the device-to-host copies are plain host ops, so this measures their
op cost, not a GPU's copy latency), stamps without the gradient noise scale's norms
(``TFCLUSTER_GRADNOISE=0``: their cost is the paired difference to "stamps"; taken on every step here,
``TFCLUSTER_GRADNOISE_EVERY=1``, their full cost: a job's default takes them on one step in 8) — and the four are called in alternating blocks (order reversed every
round, the first steps of a block not timed), so drift on a shared machine hits all alike. The model is
sized so a step takes about ``--target-ms``. Two replicas (two logical CPUs, or the visible GPUs with
``--gpu``) reduce with MWMS's own ``CollectiveAllReduce``. Also measured: the reader thread's cost
(``stampreader.Reader.poll``) per step.

Prints the median step time of each variant and the added µs per step and % of the step.
On a GPU host (``--gpu``, TensorFlow with CUDA) this is the one-command check of the GPU path: it also
checks that the synced stamps see GPU compute (the compute part grows with the model's matmuls) and
prints PASS/FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


_KEYS: list = []  # one CollectiveKeys for every strategy of the process: instance keys must not repeat


def build(tf, gpu: bool, width: int):
    from tensorflow.python.distribute import collective_util, cross_device_utils
    from tensorflow.python.distribute import cross_device_ops as cdo

    from worker_entry.instrument import hooks as instrument

    instrument.install()
    devices = [d.name for d in tf.config.list_logical_devices("GPU")][:2] if gpu else ["/cpu:0", "/cpu:1"]
    if not _KEYS:
        _KEYS.append(cross_device_utils.CollectiveKeys())
    ops = cdo.CollectiveAllReduce(devices, len(devices), collective_util.Options(), collective_keys=_KEYS[0])
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential(
            [keras.layers.Input((width,))]
            + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
            + [keras.layers.Dense(1)]
        )
        opt = keras.optimizers.SGD(0.001)
    x = tf.random.normal([256, width])
    ds = tf.data.Dataset.from_tensors((x, tf.reduce_sum(x, 1, keepdims=True))).repeat()
    it = iter(strategy.experimental_distribute_dataset(ds))

    def step(batch):
        def fn(inp):
            xb, yb = inp
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(fn, args=(batch,)), axis=None)

    variants = {}
    for name, clock, sync, norms in (
        ("off", "0", "0", "1"),
        ("stamps", "1", "0", "1"),
        ("stamps + sync", "1", "1", "1"),
        ("stamps - norms", "1", "0", "0"),  # without the gradient noise scale's two squared norms
    ):
        os.environ["TFCLUSTER_STEPCLOCK"], os.environ["TFCLUSTER_STAMP_SYNC"] = clock, sync
        os.environ["TFCLUSTER_GRADNOISE"] = norms
        f = tf.function(step)
        f(next(it))  # trace now, under this variant's environment
        variants[name] = f
    return variants, it


def measure(variants, it, rounds: int, block: int = 1, skip: int = 0) -> dict[str, list[float]]:
    """Step times per variant (ms). ``block=1``: the variants take turns call by call (order rotated
    every round), so neighbouring calls of different variants see the same machine load."""
    times: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            f = variants[name]
            for i in range(block):
                batch = next(it)
                t0 = time.perf_counter()
                f(batch).numpy()
                if i >= skip:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def paired_added_us(times: dict[str, list[float]], name: str, base: str = "off") -> float:
    """Median over rounds of (variant - base) in µs: the calls of one round ran back to back."""
    return statistics.median((a - b) * 1e3 for a, b in zip(times[name], times[base], strict=False))


def split_of(variant, it, steps: int = 60) -> dict:
    """The step clock's record over ``steps`` steps of one traced variant (rows read right after)."""
    from worker_entry.instrument.stepclock import reader as stampreader
    from worker_entry.instrument.stepclock import ring as stampring

    stampring.drain()
    for _ in range(steps):
        variant(next(it)).numpy()
    rows = stampring.drain()
    reader = stampreader.Reader(
        1e-9, min_steps=1, take=lambda: list(rows), take_inputs=list, count=lambda n, ex, at: None
    )
    reader.poll()
    return reader.last_record or {}


def gpu_check(variants, it) -> dict:
    """On a GPU: launch-time stamps (sync off) put the GPU's forward/backward time into the all-reduce;
    synced stamps must put it into compute. PASS when the synced compute is at least twice the
    launch-time one."""
    launch, synced = split_of(variants["stamps"], it), split_of(variants["stamps + sync"], it)
    ok = (synced.get("compute_ms") or 0) >= max(0.3, 2 * (launch.get("compute_ms") or 0))
    return {"launch": launch, "synced": synced, "pass": ok}


def reader_cost(steps: int) -> float:
    """µs of the reader's poll per step (rows → steps → window), on the rows the run left in the rings."""
    from worker_entry.instrument.stepclock import reader as stampreader
    from worker_entry.instrument.stepclock import ring as stampring

    rows = stampring.drain()
    reader = stampreader.Reader(1e9, take=lambda: list(rows), take_inputs=list, count=lambda n, ex, at: None)
    t0 = time.perf_counter()
    n = reader.poll()
    return (time.perf_counter() - t0) * 1e6 / max(1, n or steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="two replicas on the visible GPUs (a GPU host's check)")
    ap.add_argument("--target-ms", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    # the norms on every step: this script's medians of single steps would never see the one step in k
    # that carries them (the default in a job); their cost with sampling: bench/gradnorm_time.py
    os.environ.setdefault("TFCLUSTER_GRADNOISE_EVERY", "1")
    import tensorflow as tf

    if not args.gpu:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    elif len(tf.config.list_physical_devices("GPU")) < 1:
        print("no GPU visible to TensorFlow: run without --gpu, or on a host with CUDA TensorFlow", file=sys.stderr)
        return 2
    elif len(tf.config.list_physical_devices("GPU")) == 1:
        gpu = tf.config.list_physical_devices("GPU")[0]
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(1024)] * 2)
    rounds = args.rounds or (300 if args.quick else 2000)
    out: dict = {"device": "GPU" if args.gpu else "CPU"}
    # 1. the added time per step, measured where the step is short (its noise is small in µs)
    variants, it = build(tf, args.gpu, 32)
    measure(variants, it, 20)
    tiny = measure(variants, it, rounds)
    out["tiny_step_ms"] = round(statistics.median(tiny["off"]), 3)
    out["added_us"] = {n: round(paired_added_us(tiny, n), 1) for n in variants if n != "off"}
    # 2. the same at a step of about --target-ms: the ratio there
    width = 64
    for _ in range(8):
        variants, it = build(tf, args.gpu, width)
        t = statistics.median(measure({"off": variants["off"]}, it, 12)["off"])
        if t >= 0.7 * args.target_ms or width >= 4096:
            break
        width = int(width * min(2.0, max(1.2, (args.target_ms / max(t, 0.1)) ** 0.5)))
    times = measure(variants, it, max(60, rounds // 10))
    base = statistics.median(times["off"])
    out.update(
        width=width,
        steps_per_variant=len(times["off"]),
        median_ms={n: round(statistics.median(v), 3) for n, v in times.items()},
        added_us_at_target={n: round(paired_added_us(times, n), 1) for n in variants if n != "off"},
        added_pct_of_target={n: round(out["added_us"][n] / (args.target_ms * 1e3) * 100, 2) for n in out["added_us"]},
        norms_us=round(paired_added_us(tiny, "stamps", "stamps - norms"), 1),
        norms_us_at_target=round(paired_added_us(times, "stamps", "stamps - norms"), 1),
        norms_pct_at_target=round(paired_added_us(times, "stamps", "stamps - norms") / (base * 1e3) * 100, 2),
        reader_us_per_step=round(reader_cost(len(times["stamps"])), 1),
    )
    if args.gpu:
        out["gpu_check"] = gpu_check(variants, it)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"added per step, measured on a {out['tiny_step_ms']:.2f} ms step ({out['device']}, {rounds} rounds):")
        for n, us in out["added_us"].items():
            print(
                f"  {n:<14} {us:+8.1f} µs/step  = {out['added_pct_of_target'][n]:+.2f} % of a {args.target_ms:g} ms step"
            )
        print(f"at a {base:.1f} ms step (Dense width {width}, {out['steps_per_variant']} steps each, noisier):")
        for n, us in out["added_us_at_target"].items():
            print(f"  {n:<14} {out['median_ms'][n]:8.3f} ms (off {out['median_ms']['off']:.3f})  {us:+8.1f} µs/step")
        print(f"  reader thread  {out['reader_us_per_step']:8.1f} µs of CPU per step (off the training thread)")
        print(
            f"the gradient noise scale's norms (stamps - stamps without them): {out['norms_us']:+.1f} µs/step on the "
            f"{out['tiny_step_ms']:.2f} ms step, {out['norms_us_at_target']:+.1f} µs/step = "
            f"{out['norms_pct_at_target']:+.2f} % of the {base:.1f} ms step"
        )
        if "gpu_check" in out:
            g = out["gpu_check"]
            for name in ("launch", "synced"):
                r = g[name]
                print(
                    f"  {name:<8} stamps: compute {r.get('compute_ms')} ms, in the all-reduce {r.get('collective_ms')} ms, "
                    f"step {r.get('step_ms')} ms"
                )
            print("GPU-correct stamps: " + ("PASS" if g["pass"] else "FAIL (the synced stamps do not see GPU compute)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
