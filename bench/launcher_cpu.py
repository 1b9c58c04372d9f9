#!/usr/bin/env python3
"""The whole launcher's steady-state CPU, per thread and per record, this tree against another in turn.

    python bench/launcher_cpu.py [--tasks 1024] [--seconds 15] [--vs TREE] [--rounds 2] [--pyspy DIR] [--json]

The launcher is ``tests/loadfleet.py`` of each tree (a real ``Job``/``Supervisor`` over connect-back TCP,
the nodes ``tfcluster_testbed.loadgen`` playing every rank: 1 Hz heartbeats, a step-clock window every
5 s, a log line every 10 s — what ``bench/supervisor_scale.py`` runs). Once every task ran, and
``--settle`` seconds more, over ``--seconds``: the launcher's utime+stime (``/proc/PID/stat``), each
thread's (``/proc/PID/task/TID/stat``, named by its ``comm``), and the records it wrote to
heartbeats.jsonl in that time. The generator's rate follows the box's load, so **µs of launcher CPU a
record** is the figure that compares two runs; CPU % of a core is printed beside it. A run whose
generator was starved by the box (under 0.75 records a task a heartbeat interval) is marked void and left out. ``--vs TREE``
runs the other checkout's launcher (``git worktree add`` or ``git archive REV | tar -x``) in turn, with
the same generator (this tree's), ``--rounds`` times each. ``--pyspy DIR``: a ``py-spy record --threads
--gil --format raw`` of each launcher over the same window (it pauses the launcher to sample: the CPU
figures of a profiled run are not compared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, fleet_traffic, wait_for
from supervisor_scale import EventTail, cpu_s, rss_mb

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid``, by 'comm:tid'."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm, rest = t.joinpath("stat").read_text().split("(", 1)[1].rsplit(")", 1)
            f = rest.split()
            out[f"{comm}:{t.name}"] = (int(f[11]) + int(f[12])) / TICK
    return out


def records(path: Path) -> int:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return 0


def one(
    tree: Path, tasks: int, settle: float, seconds: float, work: Path, pyspy: Path | None, interval: float = 1.0
) -> dict:
    run_dir = work / "run"
    argv = [PY, str(tree / "tests" / "loadfleet.py"), "--tasks", str(tasks), "--run-dir", str(run_dir)]
    argv += [*fleet_traffic(interval), "--timeout", str(max(30.0, 15 * interval))]
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}:{REPO}",
    }  # the tree's product; the generator is REPO's when it lacks one
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(work / "launcher.err", "wb"))  # noqa: SIM115
    row: dict = {"tree": str(tree), "tasks": tasks}
    try:
        tail = EventTail(run_dir / "events.jsonl")
        wait_for(lambda: tail.count("task_spawned") >= tasks or proc.poll() is not None, 300, "every task running")
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher ended before every task ran; see {work}")
        time.sleep(settle)
        hb = run_dir / "heartbeats.jsonl"
        spy = None
        if pyspy is not None:
            out = pyspy / f"{tree.name}-{int(time.time())}.txt"
            spy_argv = ["py-spy", "record", "--pid", str(proc.pid), "--duration", str(int(seconds))]
            spy_argv += ["--rate", "200", "--threads", "--gil", "--format", "raw", "-o", str(out)]
            spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            row["pyspy"] = str(out)
        c0, th0, r0, t0, load0 = cpu_s(proc.pid), threads(proc.pid), records(hb), time.monotonic(), os.getloadavg()[0]
        time.sleep(seconds)
        c1, th1, r1, t1 = cpu_s(proc.pid), threads(proc.pid), records(hb), time.monotonic()
        if spy is not None:
            spy.wait(60)
        wall = t1 - t0
        row["cpu_pct"] = round(100 * (c1 - c0) / wall, 1)
        row["records_per_s"] = round((r1 - r0) / wall)
        row["us_per_record"] = round(1e6 * (c1 - c0) / max(1, r1 - r0))
        row["threads_pct"] = {
            k: round(100 * (v - th0.get(k, 0.0)) / wall, 1)
            for k, v in th1.items()
            if v - th0.get(k, 0.0) > 0.005 * wall
        }
        row["rss_mb"] = round(rss_mb(proc.pid) or 0, 1)
        row["load"] = (round(load0, 1), round(os.getloadavg()[0], 1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1024)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--vs", help="another checkout: its launcher measured the same way, in turn")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pyspy", help="a directory: a py-spy profile of each launcher over the window")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--interval", type=float, default=1.0, help="the heartbeat interval, s (4 at 16,384 tasks)")
    args = ap.parse_args()
    trees = {"this": REPO, **({"vs": Path(args.vs).resolve()} if args.vs else {})}
    spy = Path(args.pyspy).resolve() if args.pyspy else None
    if spy is not None:
        spy.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory(prefix="tfc-lcpu-") as work:
                row = one(tree, args.tasks, args.settle, args.seconds, Path(work), spy, args.interval)
            rows[name].append(row)
            if not args.json:
                print(name, json.dumps(row), flush=True)
    # a generator starved by the box's load (under ~0.75 records a task an interval) makes the launcher's
    # fixed per-second work (snapshots, scans) look like per-record cost: such a run is void, said so
    for v in rows.values():
        for r in v:
            r["void"] = r["records_per_s"] < 0.75 * args.tasks / args.interval
    summary = {
        k: statistics.median(kept) if (kept := [r["us_per_record"] for r in v if not r["void"]]) else None
        for k, v in rows.items()
    }
    if args.json:
        print(json.dumps({"rows": rows, "median_us_per_record": summary}))
    else:
        print("median µs of launcher CPU a record:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
