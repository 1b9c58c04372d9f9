"""One measurement of a bench script, in this checkout and another in turn (``--vs TREE``), ``--rounds`` times.

Shared by the in-process benches (``message_path.py``, ``ingest_path.py``, ``launcher_parts.py``): each
measures in a fresh interpreter (``--one``: a single measurement printed as JSON on its last line), with
the measured checkout first on ``PYTHONPATH`` and named by ``TFC_BENCH_TREE``; the two trees alternate, so
a shared box's load falls on both alike and only their ratio is read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def parser(doc: str, *, tasks: int, seconds: int) -> argparse.ArgumentParser:
    """The options every such bench takes (``--json`` where the script prints JSON is its own)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=tasks)
    ap.add_argument("--seconds", type=int, default=seconds)
    ap.add_argument("--vs", help="another checkout of the repository: the same measurement there, in turn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single measurement, as JSON
    return ap


def in_turn(
    script: str, args: argparse.Namespace, measure: Callable[[int, int], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]] | None:
    """Each tree's measurements (``this``, and ``vs`` with ``--vs``), ``args.rounds`` of each, alternating.
    Under ``--one`` (how this runs each of them): ``measure(tasks, seconds)`` printed as JSON, and None."""
    if args.one:
        print(json.dumps(measure(args.tasks, args.seconds)))
        return None
    trees = {"this": REPO, **({"vs": Path(args.vs).resolve()} if args.vs else {})}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    argv = [sys.executable, script, "--one", "--tasks", str(args.tasks), "--seconds", str(args.seconds)]
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree), "TFC_BENCH_TREE": str(tree)}
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=900)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs
