#!/usr/bin/env python3
"""The gradient noise scale's norms, timed against the step they ride on: <= 1 % of a step (issue 30).

    python bench/gradnorm_time.py [--quick] [--json] [--models dense,cnn] [--rounds N] [--block 1]
                                  [--target-ms 10] [--every K]

Why a script of its own: on a shared machine (load 5-15 on 2 cores) a step's wall time moves by more
than the norms could cost; ``stamp_cost.py``'s paired wall medians of the norms scattered from -35 to
+87 µs between runs (§19). Here the figure read first is the **training process's own CPU time per
step** (user + sys of all its threads, ``time.process_time``: TensorFlow's thread pools included),
which other processes cannot add to — they slow it (cache, preemption while a peer thread spins), and
that hits the variants alike — next to the wall time.

One process, two replicas (two logical CPUs) reducing with MWMS's own ``CollectiveAllReduce``, the step
clock on. Each model traced three times: with the norms (``on``, ``TFCLUSTER_GRADNOISE=1``, the
default) and twice without (``off``, ``off2``; ``=0``, read at trace time). Then ``--rounds`` rounds of
one block of ``--block`` steps per variant (each step timed alone, a block's figure the median of its
steps), the order rotated and reversed round by round so that neighbours share the machine's load.
Per round: the norms = ``on`` against the mean of ``off`` and ``off2``, in % of that; the control =
``off2`` against ``off`` (the A/A comparison: what the method reads where there is nothing to find —
two traces of the same step differ by their memory layout and thread placement). Reported: the median
over rounds, their interquartile range, and a distribution-free 95 % confidence interval of the median
(order statistics of the binomial). An interval containing 0: the cost is below what the rounds
resolve, "< the interval's top". Models:

* ``dense``: ``bench/stamp_cost.py``'s custom loop (strategy.run, tape.gradient, SGD apply_gradients,
  strategy.reduce), Dense layers widened until a step costs about ``--target-ms`` of CPU.
* ``cnn``: the train step of a Keras ``fit`` (``model.train_function``, what ``fit`` calls each step) of
  a small CNN (two convolutions, 32x32x3 inputs, 10 classes, Adam, 32 examples per replica).

The norms are taken on every k-th step (``TFCLUSTER_GRADNOISE_EVERY``, default 8): ``--every K`` traces
``on`` with that period (default: the tracer's own), and then a fourth variant, ``on1``, is traced with
the norms on every step (``norms every step`` in the output: what sampling saves). With k > 1 one step
in k carries the norms, so a block's figure must be its **mean** per step over a whole period, not the
median of its steps (which would never see the sampled step): ``--block`` defaults to k, timed as one
interval.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stamp_cost  # sets the repository on sys.path and TensorFlow's environment

os.environ["TFCLUSTER_STEPCLOCK"] = "1"


def say(text: str) -> None:
    print(f"[gradnorm_time] {text}", file=sys.stderr, flush=True)


def dense(tf, target_ms: float, width: int | None = None, on1: bool = False) -> tuple[dict, str]:
    """stamp_cost's step, widened until a step costs about ``target_ms`` of CPU: {"on", "off", "off2"}
    ("off2": a second trace without the norms, the A/A control; ``on1``: also "on1", the norms on every
    step); ``width`` given: that width."""
    fixed, width = width is not None, width or 64
    for _ in range(10):
        variants, it = stamp_cost.build(tf, False, width)
        if fixed:
            break
        for _ in range(3):
            variants["stamps"](next(it)).numpy()
        t = block(lambda f=variants["stamps"], it=it: f(next(it)).numpy(), 15)[0]
        if t >= 0.8 * target_ms or width >= 4096:
            break
        width = int(width * min(2.0, max(1.15, (target_ms / max(t, 0.1)) ** 0.5)))
    os.environ.update(TFCLUSTER_STEPCLOCK="1", TFCLUSTER_STAMP_SYNC="0", TFCLUSTER_GRADNOISE="0")
    again = tf.function(variants["stamps"].python_function)
    again(next(it))  # traced now, without the norms
    os.environ["TFCLUSTER_GRADNOISE"] = "1"
    step = {"on": variants["stamps"], "off": variants["stamps - norms"], "off2": again}
    if on1:
        step["on1"] = every_step(lambda: tf.function(variants["stamps"].python_function), lambda f: f(next(it)))
    return {k: (lambda f=f: f(next(it)).numpy()) for k, f in step.items()}, f"Dense width {width}, custom loop"


def every_step(make, trace):
    """``make()`` a step function and ``trace`` it with the norms on every step (``on1``)."""
    was = os.environ.get("TFCLUSTER_GRADNOISE_EVERY")
    os.environ["TFCLUSTER_GRADNOISE_EVERY"] = "1"
    try:
        f = make()
        trace(f)
    finally:
        if was is None:
            os.environ.pop("TFCLUSTER_GRADNOISE_EVERY", None)
        else:
            os.environ["TFCLUSTER_GRADNOISE_EVERY"] = was
    return f


def cnn(tf, on1: bool = False) -> tuple[dict, str]:
    """A small CNN's Keras ``fit`` train step under the two-replica strategy: three models, one traced
    with the norms, two without ("off2": the A/A control, a model of its own as "on" has); ``on1``: a
    fourth, the norms on every step."""
    from tensorflow.python.distribute import collective_util, cross_device_utils
    from tensorflow.python.distribute import cross_device_ops as cdo

    if not stamp_cost._KEYS:
        stamp_cost._KEYS.append(cross_device_utils.CollectiveKeys())
    devices = ["/cpu:0", "/cpu:1"]
    ops = cdo.CollectiveAllReduce(devices, 2, collective_util.Options(), collective_keys=stamp_cost._KEYS[0])
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    keras = tf.keras
    x = tf.random.normal([64, 32, 32, 3])
    y = tf.random.uniform([64], 0, 10, tf.int64)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()

    def traced(norms: str):
        os.environ["TFCLUSTER_GRADNOISE"] = norms
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.layers.Input((32, 32, 3)),
                    keras.layers.Conv2D(32, 3, activation="relu"),
                    keras.layers.MaxPooling2D(),
                    keras.layers.Conv2D(64, 3, activation="relu"),
                    keras.layers.MaxPooling2D(),
                    keras.layers.Flatten(),
                    keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)  # traces train_function under this environment
        it = iter(strategy.experimental_distribute_dataset(ds))
        fn = model.train_function
        return (lambda fn=fn, it=it: float(fn(it)["loss"])), model.count_params()

    steps = {}
    for name, norms in (("on", "1"), ("off", "0"), ("off2", "0")):
        steps[name], params = traced(norms)
    if on1:
        steps["on1"], _ = every_step(lambda: traced("1"), lambda made: None)
    os.environ["TFCLUSTER_GRADNOISE"] = "1"
    return steps, f"CNN, {params:,} parameters, Keras fit's train_function, Adam"


def block(step, n: int, mean: bool = False) -> tuple[float, float]:
    """(CPU ms, wall ms) of ``n`` steps, each the median of the steps timed one by one (a step that
    another process preempted is an outlier, not a shift); ``mean``: the ``n`` steps timed as one
    interval, per step (a sampling period: its one step with the norms counts)."""
    if mean:
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            step()
        return (time.process_time() - c0) / n * 1e3, (time.perf_counter() - w0) / n * 1e3
    cpu, wall = [], []
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def median_ci(values: list[float]) -> tuple[float, float]:
    """Distribution-free 95 % interval of the median: sorted values j and n-1-j (0-based), j the largest
    with P(Binomial(n, 1/2) <= j) <= 2.5 % (the whole range when n is too small for 95 %)."""
    v = sorted(values)
    n = len(v)
    j, cum = -1, 0.0
    while j + 1 < n // 2 and cum + math.comb(n, j + 1) / 2**n <= 0.025:
        cum += math.comb(n, j + 1) / 2**n
        j += 1
    j = max(j, 0)
    return v[j], v[n - 1 - j]


def summary(pct: list[float]) -> dict:
    q = statistics.quantiles(pct, n=4) if len(pct) >= 4 else [min(pct), 0, max(pct)]
    lo, hi = median_ci(pct)
    return {"median": statistics.median(pct), "iqr": [q[0], q[2]], "ci95": [lo, hi], "resolved": lo > 0 or hi < 0}


def run(steps: dict, rounds: int, n: int, mean: bool = False) -> dict:
    """``rounds`` rounds of one block per variant, the order rotated and reversed round by round; per
    round the paired differences "on" - the mean of "off" and "off2" (the norms) and "off2" - "off"
    (the control: what the method reads where there is nothing to find, i.e. its resolution)."""
    names = list(steps)
    for _ in range(2):
        for name in names:
            block(steps[name], 3)  # warm every variant
    cpu: dict = {k: [] for k in names}
    wall: dict = {k: [] for k in names}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order if (r // len(names)) % 2 == 0 else order[::-1]:
            c, w = block(steps[name], n, mean)
            cpu[name].append(c)
            wall[name].append(w)
        if r % 10 == 9:
            loads.append(os.getloadavg()[0])
    out = {"rounds": rounds, "block": n, "mean": mean, "load": [min(loads), max(loads)]}
    for what, t in (("cpu", cpu), ("wall", wall)):
        base = [(a + b) / 2 for a, b in zip(t["off"], t["off2"], strict=True)]
        out[what] = {"off_ms": statistics.median(base)}
        pairs = [("norms", t["on"], base), ("control", t["off2"], t["off"])]
        if "on1" in t:
            pairs.append(("norms every step", t["on1"], base))
        for label, x, ref in pairs:
            pct = [(a - b) / b * 100 for a, b in zip(x, ref, strict=True)]
            us = [(a - b) * 1e3 for a, b in zip(x, ref, strict=True)]
            out[what][label] = {
                "ms": statistics.median(x),
                "ref_ms": statistics.median(ref),
                "added_us": statistics.median(us),
                "pct": summary(pct),
            }
    return out


def profile(tf, steps: dict, n: int) -> dict:
    """The traced step's ops under TensorFlow's profiler, ``n`` steps of ``on`` and of ``off``: per step,
    the ops' own time (kernel durations, executor overhead not included) in all, in the norms' ops
    (``tfcluster_gns``), and the op count: what the norms cost the executors, load aside (a kernel of a
    few µs is rarely preempted; medians of the per-op durations)."""
    import tempfile

    from worker_entry.instrument.profiler import trace_events

    out = {}
    for name in ("on", "off"):
        for _ in range(5):
            steps[name]()
        with tempfile.TemporaryDirectory(prefix="gradnorm_time_") as logdir:
            tf.profiler.experimental.start(logdir)
            for _ in range(n):
                steps[name]()
            tf.profiler.experimental.stop()
            (plane,) = Path(logdir).rglob("*.xplane.pb")
            events = trace_events.events_from_xspace(plane.read_bytes())
        ops = [e for e in events if e.long_name]
        gns = [e for e in ops if "tfcluster_gns" in e.long_name]
        by_type: dict = {}
        for e in gns:
            by_type.setdefault(e.name, []).append(e.dur_ns / 1e3)
        out[name] = {
            "ops_per_step": len(ops) / n,
            "op_us_per_step": sum(e.dur_ns for e in ops) / 1e3 / n,
            "norms_ops_per_step": len(gns) / n,
            "norms_op_us_per_step": sum(e.dur_ns for e in gns) / 1e3 / n,
            "norms_median_us": {k: round(statistics.median(v), 2) for k, v in sorted(by_type.items())},
            "sendrecv_per_step": sum(e.name in ("_Send", "_Recv", "_HostSend", "_HostRecv") for e in ops) / n,
            "types": {t: c / n for t, c in collections.Counter(e.name for e in ops).items()},
            "type_us": {t: sum(e.dur_ns for e in ops if e.name == t) / 1e3 / n for t in {e.name for e in ops}},
        }
    types = set(out["on"]["types"]) | set(out["off"]["types"])
    out["added_per_step"] = {
        t: [
            round(out["on"]["types"].get(t, 0) - out["off"]["types"].get(t, 0), 2),
            round(out["on"]["type_us"].get(t, 0) - out["off"]["type_us"].get(t, 0), 1),
        ]
        for t in sorted(types)
        if abs(out["on"]["types"].get(t, 0) - out["off"]["types"].get(t, 0)) >= 0.5
    }
    for name in ("on", "off"):
        del out[name]["types"], out[name]["type_us"]
    return out


def reductions(tf, sizes=(16_000, 50_000, 150_000), k: int = 40, rounds: int = 5) -> dict:
    """CPU µs of one squared norm of a float32 vector of each size, by three ways to take it (``l2_loss``,
    what gradnorms uses; ``tensordot``; a 1xn by nx1 ``matmul``): ``k`` of them in one traced function,
    against the same function reading one element of each (the call's own cost), rounds alternated."""

    def cost(f, xs, n: int = 200) -> float:
        for _ in range(10):
            f(xs)
        c0 = time.process_time()
        for _ in range(n):
            f(xs)
        return (time.process_time() - c0) / n * 1e6 / k

    fns = {
        "base": tf.function(lambda xs: tf.add_n([x[0] for x in xs])),
        "l2_loss": tf.function(lambda xs: tf.add_n([tf.nn.l2_loss(x) for x in xs])),
        "tensordot": tf.function(lambda xs: tf.add_n([tf.tensordot(x, x, 1) for x in xs])),
        "matmul": tf.function(
            lambda xs: tf.add_n([tf.reduce_sum(tf.matmul(tf.reshape(x, [1, -1]), tf.reshape(x, [-1, 1]))) for x in xs])
        ),
    }
    out = {}
    for size in sizes:
        xs = [tf.random.normal([size]) for _ in range(k)]
        times: dict = {name: [] for name in fns}
        for _ in range(rounds):
            for name, f in fns.items():
                times[name].append(cost(f, xs))
        base = statistics.median(times["base"])
        out[size] = {name: round(statistics.median(v) - base, 1) for name, v in times.items() if name != "base"}
    return out


def line(what: str, label: str, r: dict) -> str:
    p = r[label]["pct"]
    ref = "off" if label == "control" else "off, off2"
    verdict = (
        f"{p['median']:+.2f} % (95 % CI {p['ci95'][0]:+.2f} … {p['ci95'][1]:+.2f})"
        if p["resolved"]
        else f"< {max(p['ci95'][1], 0):.2f} % (not resolved: median {p['median']:+.2f} %, 95 % CI "
        f"{p['ci95'][0]:+.2f} … {p['ci95'][1]:+.2f})"
    )
    return (
        f"  {what:<4} {label:<16} {r[label]['ms']:8.3f} ms/step vs {r[label]['ref_ms']:.3f} ({ref}): {r[label]['added_us']:+8.1f} µs,"
        f" {verdict}; rounds' IQR {p['iqr'][0]:+.2f} … {p['iqr'][1]:+.2f} %"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of the rounds")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--models", default="dense,cnn", help='comma-separated: dense, cnn ("": none)')
    ap.add_argument("--rounds", type=int, default=None, help="rounds per model (default dense 3000, cnn 600)")
    ap.add_argument("--block", type=int, default=None, help="steps per variant and round (default: the period k)")
    ap.add_argument(
        "--every",
        type=int,
        default=None,
        help="the norms on every K-th step (TFCLUSTER_GRADNOISE_EVERY; default its own)",
    )
    ap.add_argument("--target-ms", type=float, default=10.0, help="the dense model's step, about")
    ap.add_argument("--width", type=int, default=None, help="the dense model's width (instead of --target-ms)")
    ap.add_argument("--intra-op", type=int, default=None, help="TensorFlow's intra-op threads (default: its own)")
    ap.add_argument("--reductions", action="store_true", help="also: one squared norm's CPU cost, by op and size")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS", help="also the ops under the profiler")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]  # "": none (with --reductions)
    bad = [m for m in models if m not in ("dense", "cnn")]
    if bad:
        print(f"--models: unknown {', '.join(bad)} (allowed: dense, cnn)", file=sys.stderr)
        return 2
    if args.every is not None:
        os.environ["TFCLUSTER_GRADNOISE_EVERY"] = str(args.every)
    from worker_entry.instrument.stepclock import gradnorms

    every = gradnorms.every()
    n = args.block or every
    mean = every > 1  # a block must hold the sampled step: its mean, not its median
    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    out: dict = {}
    for model in models:
        steps, desc = dense(tf, args.target_ms, args.width, every > 1) if model == "dense" else cnn(tf, every > 1)
        rounds = args.rounds or {"dense": 3000, "cnn": 600}[model] // (10 if args.quick else 1)
        say(f"{model}: {desc}: norms every {every} step(s); {rounds} rounds of {n}-step blocks")
        out[model] = {"model": desc, "every": every, **run(steps, rounds, n, mean)}
        if args.profile:
            out[model]["profile"] = profile(tf, steps, args.profile)
        if not args.json:
            r = out[model]
            print(
                f"{model}: {desc}; norms every {every} step(s); {r['rounds']} rounds x {r['block']} steps"
                f"{' (mean)' if mean else ''}, load {r['load'][0]:.1f}-{r['load'][1]:.1f}"
            )
            for what in ("cpu", "wall"):
                for label in [x for x in ("norms", "norms every step", "control") if x in r[what]]:
                    print(line(what.upper() if what == "cpu" else what, label, r[what]), flush=True)
            for name, p in r.get("profile", {}).items():
                print(f"  profiled {name:<3} {json.dumps(p)}", flush=True)
    if args.reductions:
        out["reductions_cpu_us"] = reductions(tf)
        if not args.json:
            for size, by_op in out["reductions_cpu_us"].items():
                print(
                    f"one squared norm of {size:,} floats, CPU µs: "
                    + ", ".join(f"{k} {v:+.1f}" for k, v in by_op.items())
                )
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
