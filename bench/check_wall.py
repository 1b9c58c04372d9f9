#!/usr/bin/env python3
"""`tfcluster check`'s wall time on the namespace test bed: N hosts, each its own sshd, real TensorFlow.

    python bench/check_wall.py [--hosts 3,8] [--repeat 2] [--json]

Needs root. For each host count: `tfcluster check SPEC --json` (launcher in the controller namespace,
worker_entry's own interpreter on the hosts), the launcher's wall time, the check's own phases from
check.json (the nodes' link rounds and their whole check), and whether it named anything (a healthy
bed must name nothing). Budget in the issue: <= 30 s for 8 hosts on a real cluster; here every host
shares the same cores, so TensorFlow's import (~4.5 s of CPU each) is paid N times on 2 cores.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, base_parser, launcher_env, say, set_verbose, testbed

from tfcluster_testbed import netns_available


def one(tb, spec: Path, run_dir: Path) -> dict:
    argv = tb.launcher_argv([PY, "-m", "orchestrator", "check", str(spec), "--json", "-o", str(run_dir)])
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, env=launcher_env(), timeout=600)
    wall = time.monotonic() - t0
    check = json.loads(out.stdout) if out.stdout.strip() else {}
    nodes = check.get("nodes", {}).values()
    return {
        "rc": out.returncode,
        "wall_s": round(wall, 2),
        "links_s": max((n.get("links_s") or 0 for n in nodes), default=None),
        "node_s": max((n.get("wall_s") or 0 for n in nodes), default=None),
        "findings": [f["what"] for f in check.get("findings", [])],
        "gflops": [round(h["gflops"] or 0, 1) for h in check.get("hosts", [])],
        "allreduce_ms": [round(a["latency_s"] * 1e3, 2) for a in check.get("allreduce", [])],
    }


def main() -> int:
    p = base_parser(__doc__.split("\n")[0])
    p.add_argument("--hosts", default="3,8")
    args = p.parse_args()
    set_verbose(getattr(args, "verbose", False))
    if not netns_available():
        print("needs root and `ip netns`", file=sys.stderr)
        return 2
    results = {}
    for n in [int(x) for x in args.hosts.split(",")]:
        with testbed(n, mode="netns") as tb, tempfile.TemporaryDirectory(prefix="check-bench-") as tmp:
            python = Path(tmp) / "python-this-repo"  # the hosts run this checkout's worker_entry
            python.write_text(f'#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {PY} "$@"\n')
            python.chmod(0o755)
            job = {"startup_timeout_s": 120, "python": str(python)}
            spec = tb.write_spec(Path(tmp) / "spec.yaml", "checkbench", ["true"], job=job)
            runs = [one(tb, spec, Path(tmp) / f"run{i}") for i in range(args.repeat or 2)]
            results[n] = {"runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs)}
            say(f"{n} hosts: wall {[r['wall_s'] for r in runs]} s, rc {[r['rc'] for r in runs]}")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for n, r in results.items():
            for run in r["runs"]:
                print(
                    f"{n} hosts: rc {run['rc']} wall {run['wall_s']} s (nodes {run['node_s']} s, links {run['links_s']} s) "
                    f"gflops {run['gflops']} all-reduce {run['allreduce_ms']} ms findings {run['findings']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
