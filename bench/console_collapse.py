#!/usr/bin/env python3
"""The console's collapse of what every rank says (``sinks.collapse``): its cost in the launcher's log path.

    PYTHONPATH=. python3 bench/console_collapse.py [TASKS] [ROUNDS] [REPEATS]

In process, no network: a ``LogRouter`` (per-task logs, combined.log, the console into memory) gets, per
round, one frame from every task holding TensorFlow's banner line (hidden), a line every task says alike
(collapsed) and a line of its own (shown with its prefix), flushed once per round as the supervisor's
tick does. Measured with ``--all-output`` (no collapse, no filter) and by default, alternating; the median
of REPEATS: lines/s through the router and the console lines it printed.
"""

from __future__ import annotations

import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.runs import RunDir
from orchestrator.sinks.logs import LogRouter

BANNER = b"I0000 00:00:1795777703.404786   31791 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"


def once(tasks: int, rounds: int, all_output: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        out = io.BytesIO()
        router = LogRouter(RunDir.create(Path(d) / "run"), out=out, color=False, all_output=all_output)
        router.open_attempt(0, [(f"worker:{i}", f"worker-{i}", f"10.0.{i // 256}.{i % 256}") for i in range(tasks)])
        t0 = time.perf_counter()
        for k in range(rounds):
            for i in range(tasks):
                router.write(f"worker:{i}", BANNER + b"Epoch %d/100 same on every rank\n" % k + b"own %d %d\n" % (i, k))
            router.flush()
        router.close()
        return time.perf_counter() - t0, out.getvalue().count(b"\n")


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog="example: python bench/console_collapse.py 1024 20 3"
    )
    ap.add_argument("tasks", nargs="?", type=int, default=1024, help="tasks printing (default 1024)")
    ap.add_argument("rounds", nargs="?", type=int, default=20, help="rounds of lines per task (default 20)")
    ap.add_argument("repeats", nargs="?", type=int, default=3, help="timed repeats (default 3)")
    args = ap.parse_args()
    tasks, rounds, repeats = args.tasks, args.rounds, args.repeats
    lines = tasks * rounds * 3
    runs: dict[bool, list[float]] = {True: [], False: []}
    shown: dict[bool, int] = {}
    for r in range(repeats):
        for all_output in (True, False) if r % 2 == 0 else (False, True):  # ABBA
            seconds, shown[all_output] = once(tasks, rounds, all_output)
            runs[all_output].append(seconds)
    for all_output, label in ((True, "--all-output"), (False, "default (collapse + filter)")):
        s = statistics.median(runs[all_output])
        print(
            f"{label:28s} {lines} lines, {tasks} tasks: {lines / s:10,.0f} lines/s   console lines {shown[all_output]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
