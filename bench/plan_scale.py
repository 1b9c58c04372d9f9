"""bench/plan_scale.py: ``validate``, ``plan``, ``plan --json`` and the run's plan.json at N tasks.

Each size is a Slurm spec (N/4 nodes x 4 tasks, one GPU each: a 512-node x 8-GPU cluster is the same
size) and an SSH spec (N hosts, one task each). Each command runs as its own ``python -m orchestrator``
process: its wall time, its peak RSS (``wait4``) and its output's bytes. plan.json is what a launch
writes into the run directory (the plan record, ``runs.write_plan``), measured in a child process as
well. CPU time (user + system, wait4) is the figure to compare on a shared machine; wall time is shown
beside it. The last lines are the log-log growth exponents (CPU seconds, MB and bytes against N) between
the smallest and the largest size: 1 is linear, 2 quadratic (a fixed start-up cost pulls them below 1).

    python3 bench/plan_scale.py [--sizes 256,1024,4096] [--baseline DIR] [--repeat N] [--schedulers slurm,ssh] [--json]

``--baseline DIR``: the same commands on another checkout (e.g. ``git archive <commit> | tar -x -C DIR``),
alternating with this one per size: before and after side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

#: plan.json as a launch writes it, in a child of its own (its RSS is the planner's and the writer's).
RECORD = """
import sys
sys.path.insert(0, sys.argv[3])
from orchestrator.schedulers import load_plan
_, plan = load_plan(sys.argv[1], run_id="bench")
try:
    from orchestrator.plan.record import PlanRecord
    data = PlanRecord.from_plan(plan).to_json()
except ImportError:  # the code before the plan record: what job.py wrote
    import json
    data = json.dumps(plan.to_dict(record=True), indent=2)
open(sys.argv[2], "w").write(data)
"""


def specs(n: int, d: Path) -> dict[str, Path]:
    job = {"command": ["python3", "train.py"], "remote_dir": "/scratch/tfcluster"}
    slurm = {
        "version": 1,
        "name": f"slurm{n}",
        "scheduler": "slurm",
        "slurm": {"nodes": n // 4, "tasks_per_node": 4, "gpus_per_node": 4},
        "job": job,
    }
    hosts = [{"address": f"node{i:05d}.cluster.example.org"} for i in range(n)]
    ssh = {"version": 1, "name": f"ssh{n}", "hosts": hosts, "ssh": {"user": "train"}, "job": job}
    out = {}
    for name, spec in (("slurm", slurm), ("ssh", ssh)):
        path = d / f"{name}-{n}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        out[name] = path
    return out


REPEAT = 1  # --repeat: each command this many times, its median wall time and RSS kept


def measured(argv: list[str], out: Path, code: Path = REPO) -> dict:
    """Wall time, peak RSS (wait4) and stdout bytes of one command (``code``: the checkout it runs), the
    median of ``REPEAT`` runs."""
    runs = [_once(argv, out, code) for _ in range(REPEAT)]
    keys = ("wall_s", "cpu_s", "rss_mb")
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"bytes": runs[-1]["bytes"]}


def _once(argv: list[str], out: Path, code: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "NO_COLOR": "1"}
    start = time.monotonic()
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.PIPE, env=env, cwd=str(out.parent))
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}: {err[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime  # what the command itself used: the box is shared, wall time is not
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "rss_mb": round(usage.ru_maxrss / 1024, 1),
        "bytes": out.stat().st_size,
    }


def size_rows(n: int, d: Path, codes: list[tuple[str, Path]], schedulers: list[str]) -> list[dict]:
    rows = []
    for scheduler, spec in specs(n, d).items():
        if scheduler not in schedulers:
            continue
        for label, code in codes:
            cli = [PY, "-m", "orchestrator"]
            row: dict = {"code": label, "scheduler": scheduler, "tasks": n}
            for what, argv in (
                ("validate", [*cli, "validate", str(spec)]),
                ("plan", [*cli, "plan", str(spec)]),
                ("plan_json", [*cli, "plan", str(spec), "--json"]),
            ):
                row[what] = measured(argv, d / f"{scheduler}-{n}-{what}.out", code)
            record = d / f"{scheduler}-{n}-plan.json"
            m = measured([PY, "-c", RECORD, str(spec), str(record), str(code)], d / f"{scheduler}-{n}-r.out", code)
            row["record"] = {**m, "bytes": record.stat().st_size}
            rows.append(row)
        for f in d.glob(f"{scheduler}-{n}-*"):
            f.unlink()
    return rows


def exponent(rows: list[dict], scheduler: str, what: str, key: str, code: str = "this") -> float | None:
    """The log-log slope of ``key`` against N between the smallest and the largest size."""
    pts = sorted((r["tasks"], r[what][key]) for r in rows if r["scheduler"] == scheduler and r["code"] == code)
    (n0, y0), (n1, y1) = pts[0], pts[-1]
    if n1 == n0 or y0 <= 0 or y1 <= 0:
        return None
    return round(math.log(y1 / y0) / math.log(n1 / n0), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="task counts, comma-separated (multiples of 4)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout to measure alongside (before/after)")
    ap.add_argument("--repeat", type=int, default=1, help="run each command N times, keep the median")
    ap.add_argument("--schedulers", default="slurm,ssh", help="which specs (default both: slurm,ssh)")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    sizes = [int(s) for s in args.sizes.split(",")]
    codes = [("this", REPO)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="plan-scale-") as tmp:
        for k, n in enumerate(sizes):
            got = size_rows(n, Path(tmp), codes if k % 2 == 0 else codes[::-1], args.schedulers.split(","))
            rows += got
            for row in got:  # as each size is done: a long run that is cut short keeps what it measured
                print(json.dumps(row), file=sys.stderr, flush=True)
            print(f"... {n} tasks done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    whats = ("validate", "plan", "plan_json", "record")
    fits = {
        f"{s} {c}": {w: {k: exponent(rows, s, w, k, c) for k in ("cpu_s", "rss_mb", "bytes")} for w in whats}
        for s in args.schedulers.split(",")
        for c, _ in codes
    }
    if args.json:
        print(json.dumps({"rows": rows, "exponents": fits}, indent=2))
        return
    head = f"{'code':8} {'scheduler':9} {'tasks':>6} " + " ".join(f"{w + ' wall/CPU s, MB, bytes':>39}" for w in whats)
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = " ".join(
            f"{r[w]['wall_s']:>8.2f} {r[w]['cpu_s']:>8.2f} {r[w]['rss_mb']:>8.1f} {r[w]['bytes']:>12,}" for w in whats
        )
        print(f"{r['code']:8} {r['scheduler']:9} {r['tasks']:>6} {cells}")
    for s, fit in fits.items():
        text = ", ".join(f"{w} {v['cpu_s']}/{v['rss_mb']}/{v['bytes']}" for w, v in fit.items())
        print(f"log-log exponent {sizes[0]}->{sizes[-1]} ({s}, CPU/RSS/bytes): {text}")


if __name__ == "__main__":
    main()
