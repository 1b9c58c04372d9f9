#!/usr/bin/env python3
"""The TensorBoard writer's CPU per second of a job of N tasks: what its thread does, timed alone.

    python bench/tensorboard_sink.py [--tasks 4096] [--seconds 70] [--json]

The records of ``--seconds`` of a job (``tests/loadfleet.py``'s shape: every task a 1 Hz heartbeat with
progress and a host sample, a step-clock window every 5 s; one status snapshot a second with every
task's rates) go through ``sinks.tensorboard``'s ``Scalars`` and ``EventFiles`` in this thread, as
the sink's thread takes them off its queue; the CPU they cost over the simulated seconds is the share of
a core the writer needs to keep up (over 100 %: it falls behind and its bounded queue drops), the first
second (every task's first point: its directory and event file made) apart. Run it
from a worktree (``PYTHONPATH`` picks the code); ``crc32c`` in the environment or not is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def records(tasks: int, second: int, t0: float) -> list[tuple[str, dict[str, Any]]]:
    """One second of the job: every task's heartbeat, a fifth of the tasks' step-clock window."""
    out = []
    for i in range(tasks):
        task = f"worker:{i}"
        ts = t0 + second + i / tasks  # the tasks' heartbeats spread over the second
        prog = {"steps": 10 * second, "epoch": 0, "examples": 640 * second, "step_time_s": 0.1, "phase": "train"}
        host = {"interval_s": 1.0, "threads": 40, "run_ms": 900.0, "wait_ms": 12.0, "wait_pct": 1.2, "steal_pct": 0.0}
        out.append((task, {"task": task, "seq": second, "ts": ts, "attempt": 0, "state": "running", "cpu_pct": 95.0,
                           "rss_mb": 600.0, "progress": {**prog, "ts": ts}, "host": host}))  # fmt: skip
        if (i + second) % 5 == 0:
            window = {"step_ms": 100.0, "input_ms": 5.0, "compute_ms": 60.0, "collective_ms": 30.0, "cpu_ms": 70.0}
            out.append((task, {"task": task, "kind": "profile", "ts": ts, "attempt": 0, "steps": 50,
                               "pre_collective_ms": 70.0, **window}))  # fmt: skip
    return out


def status(tasks: int, second: int, t0: float) -> dict[str, Any]:
    live = {"state": "running", "steps_per_s": 10.0, "examples_per_s": 640.0, "loss": 0.5, "relative_score": None}
    return {
        "updated": t0 + second + 0.5,
        "throughput": {"steps_per_s": 10.0, "examples_per_s": 640.0},
        "tasks": {f"worker:{i}": dict(live) for i in range(tasks)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4096)
    ap.add_argument("--seconds", type=int, default=70)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from orchestrator.sinks.tensorboard import TASKS_PER_SECOND, EventFiles, Scalars

    try:
        import crc32c  # noqa: F401

        native = True
    except ImportError:
        native = False
    t0 = time.time()
    first = steady = 0.0
    with tempfile.TemporaryDirectory(prefix="tfc-tb-") as tmp:
        files = EventFiles(Path(tmp) / "tb")
        sc = Scalars(min_interval_s=max(1.0, args.tasks / TASKS_PER_SECOND))
        n_rec = n_pts = 0
        for second in range(1, args.seconds + 1):
            recs, snap = records(args.tasks, second, t0), status(args.tasks, second, t0)  # not timed
            start = time.process_time()
            for task, rec in recs:
                for p in sc.record(task, rec):
                    files.add(p)
                    n_pts += 1
            for p in sc.status(snap):
                files.add(p)
                n_pts += 1
            if second % 5 == 0:  # the sink's flush_s
                files.flush()
            took = time.process_time() - start
            if second == 1:
                first = took  # every task's first point: its directory and event file made
            else:
                steady += took
            n_rec += len(recs)
        files.close()
    cpu = first + steady
    out = {
        "tasks": args.tasks,
        "seconds": args.seconds,
        "records": n_rec,
        "points": n_pts,
        "cpu_s": round(cpu, 2),
        "first_second_cpu_s": round(first, 2),
        "steady_core_pct": round(100 * steady / max(1, args.seconds - 1), 1),
        "us_per_record": round(1e6 * cpu / n_rec, 1),
        "crc32c_native": native,
        "code": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or "installed",
    }
    print(json.dumps(out) if args.json else " ".join(f"{k}={v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
