"""`tfcluster check`'s workload on each node: ``python -m worker_entry.check [--deadline-s S]``.

Started by an ordinary launch in place of the job's command (same backend, supervision, teardown), it
measures, in this order, and prints one line ``TFCLUSTER_CHECK {json}`` the launcher reads from the
task's log (``orchestrator.job.check``):

1. the link rounds (``links``: stdlib TCP on this task's TF port, before TensorFlow binds it; only the
   job's tasks get in: ``probeserver``);
2. the compute benchmark: a chain of TensorFlow matmuls for ``--matmul-s`` on every local GPU (float16,
   4096²; one thread per GPU) or, without one, on the CPU (float32, 512², one intra-op thread), started
   on every host at once
   (after an all-reduce as a barrier): GFLOP/s, 2·n³ per matmul;
3. an all-reduce of ``--sizes`` bytes per task with the job's own MWMS (``strategy.make_strategy``: the
   spec's communication, RING/AUTO on CPU, NCCL where it resolves): the mean time per operation after
   one warm-up, as nccl-tests reports it.

A watchdog ends the process (exit 3) at ``--deadline-s``, printing what was measured so far: the check
never hangs on a peer that never comes. As it reaches each phase (``checkline.PHASES``: started, links,
tensorflow, strategy, joined, compute, allreduce) it prints ``TFCLUSTER_CHECK_PHASE {json}``: when the
deadline passes with no figures anywhere, the launcher names the host the others waited for by how far
each got (``orchestrator.job.checklag``), not every host.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from ..protocol.checkline import PHASE_PREFIX, PREFIX
from ..protocol.env import Env
from .links import LinkError, link_rounds

EXIT_DEADLINE = 3
WINDOWS = 6
_result: dict[str, Any] = {}
_lock = threading.Lock()


def peers_from_tf_config(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[list[tuple[str, str, int]], int]:
    """((task, address, port) in rank order: chief first, then workers; this task's rank)."""
    config = json.loads(env.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    peers: list[tuple[str, str, int]] = []
    for kind in ("chief", "worker"):
        for i, where in enumerate(cluster.get(kind) or []):
            host, _, port = str(where).rpartition(":")
            peers.append((f"{kind}:{i}", host.strip("[]"), int(port)))
    me = f"{task.get('type', 'worker')}:{int(task.get('index', 0))}"
    ranks = [p[0] for p in peers]
    return peers, ranks.index(me) if me in ranks else 0


def emit(**update: Any) -> None:
    """Print the result line (once; the watchdog's partial line instead when the deadline came first)."""
    with _lock:
        if _result.get("printed"):
            return
        _result.update(update)
        _result["printed"] = True
        line = {k: v for k, v in _result.items() if k != "printed"}
        sys.stdout.write(PREFIX + json.dumps(line, allow_nan=False) + "\n")
        sys.stdout.flush()


def phase(name: str, started: float) -> None:
    """Say that the check reached ``name`` (``checkline.PHASES``), as it happens: a node whose result line
    never comes (its deadline passed while it waited for a peer, or it was stopped) is still known by how
    far it got, so the launcher can tell the host the others waited for from the ones that waited."""
    line = {"phase": name, "t_s": round(time.monotonic() - started, 3)}
    with _lock:
        sys.stdout.write(PHASE_PREFIX + json.dumps(line) + "\n")
        sys.stdout.flush()


def _watchdog(deadline_s: float) -> None:
    time.sleep(deadline_s)
    emit(error=f"the check's deadline ({deadline_s:g} s) passed")
    os._exit(EXIT_DEADLINE)


def matmul_gflops(tf: Any, device: str, seconds: float, gpu: bool) -> float:
    """GFLOP/s of a chain of square matmuls on ``device`` for about ``seconds`` (after a warm-up): the
    best of ``WINDOWS`` windows (robust to a moment's contention; a throttled host is slow in all)."""
    n, k = (4096, 8) if gpu else (512, 4)
    dtype = tf.float16 if gpu else tf.float32
    with tf.device(device):
        a = tf.random.uniform((n, n), dtype=dtype)
        b = tf.random.uniform((n, n), dtype=dtype) / n  # keeps the chain's values bounded

        @tf.function
        def chain(x: Any) -> Any:
            for _ in range(k):
                x = tf.matmul(x, b)
            return x[0, 0]

        chain(a).numpy()  # warm-up: tracing, allocation
        best, t0 = 0.0, time.perf_counter()
        end = t0 + seconds
        while True:  # the best of WINDOWS windows: a host's capacity, not a moment another process took
            calls, w0 = 0, time.perf_counter()
            while True:
                chain(a).numpy()
                calls += 1
                now = time.perf_counter()
                if now - w0 >= seconds / WINDOWS:
                    break
            best = max(best, calls / (now - w0))
            if now >= end:
                break
    return best * k * 2 * n**3 / 1e9


def compute(tf: Any, seconds: float) -> dict[str, Any]:
    """The host's figure: its slowest GPU (one thread each, all at once), or its CPU."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if not gpus:
        return {"device": "CPU", "gflops": matmul_gflops(tf, "/CPU:0", seconds, False), "gpus": []}
    figures: dict[str, float] = {}

    def one(dev: str) -> None:
        figures[dev] = matmul_gflops(tf, dev, seconds, True)

    threads = [threading.Thread(target=one, args=(d,)) for d in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_gpu = [{"device": d, "gflops": figures.get(d, 0.0)} for d in gpus]
    return {"device": "GPU", "gflops": min(g["gflops"] for g in per_gpu), "gpus": per_gpu}


def allreduce_times(tf: Any, strategy: Any, size_bytes: int, budget_s: float, max_iters: int = 20) -> dict[str, Any]:
    """Mean seconds per all-reduce of ``size_bytes`` float32 per task (one warm-up, then up to
    ``max_iters`` or ``budget_s``, at least 2)."""
    elems = max(1, size_bytes // 4)
    dev = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"

    @tf.function
    def step() -> Any:
        def fn() -> Any:
            with tf.device(dev):
                x = tf.fill([elems], 1.0)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)[:1]

        return strategy.run(fn)

    def once() -> float:
        t0 = time.perf_counter()
        strategy.experimental_local_results(step())[0].numpy()
        return time.perf_counter() - t0

    once()  # tracing, the collective group's first round
    warm = once()
    # every task must run the same number of collectives: the count comes from the tasks' mean warm-up
    mean = strategy.experimental_local_results(
        strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, tf.constant(warm))
        )
    )[0].numpy()
    iters = int(min(max_iters, max(2, budget_s // max(float(mean), 1e-6))))
    times = [once() for _ in range(iters)]
    return {"bytes": elems * 4, "latency_s": sum(times) / len(times), "iterations": len(times)}


def _measure(args: argparse.Namespace, started: float) -> None:
    """The TensorFlow part: the strategy, the compute benchmark, the all-reduces."""
    import tensorflow as tf

    from ..instrument.strategy import make_strategy, strategy_record

    phase("tensorflow", started)

    if not tf.config.list_physical_devices("GPU"):
        # one thread per matmul: a host's CPU rate is then its share of a core (a quota, throttling, steal
        # show), not the outcome of thread pools spinning against each other on shared cores
        tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = make_strategy()
    _result["communication"] = strategy_record(strategy)["communication"]
    phase("strategy", started)
    allreduce_times(tf, strategy, 4, 0.0, 2)  # a barrier: every host starts its matmuls at once
    phase("joined", started)
    _result.update(compute(tf, args.matmul_s))
    phase("compute", started)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    _result["allreduce"] = [allreduce_times(tf, strategy, s, args.allreduce_s) for s in sizes]
    phase("allreduce", started)
    _result["workers"] = strategy.num_replicas_in_sync
    allreduce_times(tf, strategy, 4, 0.0, 2)
    _done_barrier(args.deadline_s)


def _done_barrier(timeout_s: float) -> None:
    """Exit only when every task is done: a peer pulls its share of the last all-reduce from us
    (RecvBuf) after our own collective returned, so exiting at once can fail it ("Socket closed").
    The coordination service's barrier (MWMS configures the service); a short wait without one."""
    try:
        from tensorflow.python.eager import context

        context.context().wait_at_barrier("tfcluster_check_done", int(timeout_s * 1000))
        _result["done_barrier"] = "coordination service"
    except Exception as exc:
        _result["done_barrier"] = f"1 s wait ({type(exc).__name__})"
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker_entry.check")
    p.add_argument("--deadline-s", type=float, default=60.0)
    p.add_argument("--matmul-s", type=float, default=1.5)
    p.add_argument("--sizes", default="65536,4194304", help="all-reduce sizes in bytes per task")
    p.add_argument("--allreduce-s", type=float, default=1.0, help="time budget per size")
    args = p.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.deadline_s
    threading.Thread(target=_watchdog, args=(args.deadline_s,), daemon=True).start()
    peers, rank = peers_from_tf_config()
    _result.update(task=peers[rank][0] if peers else "worker:0", rank=rank, hostname=socket.gethostname())
    phase("started", started)
    secret = os.environ.pop(Env.CHECK_SECRET, "")  # the run's (the launcher's NodeConfig env); not for TF
    try:
        if not secret:
            raise LinkError(f"no {Env.CHECK_SECRET} in the environment: the probes would admit anyone")
        _result.update(link_rounds(peers, rank, deadline, secret.encode()))
    except (LinkError, OSError, ValueError) as exc:
        _result.update(links=[], links_error=f"{type(exc).__name__}: {exc}")
    _result["links_s"] = round(time.monotonic() - started, 3)
    phase("links", started)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        _measure(args, started)
    except Exception as exc:  # TensorFlow's errors: reported in the line, the exit code says it failed
        emit(error=f"{type(exc).__name__}: {exc}"[:2000], wall_s=round(time.monotonic() - started, 3))
        sys.stdout.flush()
        os._exit(1)
    emit(wall_s=round(time.monotonic() - started, 3))
    sys.stderr.flush()
    os._exit(0)  # TensorFlow's own teardown adds seconds and, at times, coordination-service noise
