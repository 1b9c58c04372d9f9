#!/usr/bin/env python3
"""Log throughput over connect-back channels: sealed records (AES-256-GCM) vs the same records unencrypted.

    python bench/connectback_throughput.py [--quick] [--json] [--repeat N] [--lines 300000]
    python bench/connectback_throughput.py --one sealed|plain LINES   # one launch, for an outside timer

What Slurm jobs use: the launcher's supervisor listens, 3 local `python -m worker_entry connect` nodes
dial in (loopback), prove the run's secret, and stream what their task prints. Each task is `cat` of a
pre-written file of LINES lines of 60 bytes, so only the channel differs between the two modes:

- sealed: the product — every byte after the handshake in AES-256-GCM records, both directions;
- plain:  the identical code path with the cipher swapped for a null one (the plaintext plus 16 zero
  bytes where the tag goes) in the launcher and in the nodes: same framing, relay, record sizes and
  copies, no encryption and no authentication. It exists only here, to price the cipher.

One launch = one process (`--one`): Job.run() over a ConnectBackBackend whose nodes are local
processes; every line must be in RUN/logs/worker-N.log (checked byte for byte by sha256). Reported end
to end (the process's wall time: Python start, handshakes, streaming, teardown) and marginal (minus the
same launch with `cat /dev/null`), with the CPU of the launcher and its nodes (os.wait4 rusage). Order
alternates (ABBA). Ratio printed last: sealed / plain, marginal lines/s.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, Report, base_parser, median, run_measured, say, set_verbose

LINE_BYTES = 60
TASKS = 3


class NullAEAD:
    """No cipher: the record's plaintext and 16 zero bytes for the tag (the bench's baseline only)."""

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return data + bytes(16)

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return data[:-16]


def _use_mode(mode: str) -> None:
    if mode == "plain":
        from worker_entry.protocol import seal

        seal._cipher = lambda key: NullAEAD()


def expected_bytes(n: int, tag: str) -> bytes:
    fmt = tag + " line %010d " + "x" * 60
    return b"".join((fmt % i)[:59].encode() + b"\n" for i in range(n))


def node(mode: str) -> int:
    """A node of the bench: `python -m worker_entry connect`, in the given mode."""
    _use_mode(mode)
    from worker_entry.agent.modes.connect import main

    return main()


def one(mode: str, lines: int, work: Path) -> dict:
    """One launch in this process (the caller times the process)."""
    _use_mode(mode)
    import yaml

    from orchestrator.backends.tcp import ConnectBackBackend
    from orchestrator.job import Job, LaunchOptions
    from orchestrator.schedulers.ssh import ssh_plan
    from orchestrator.spec import load_spec_text
    from worker_entry import protocol as p

    src = f"{work}/lines-$TFCLUSTER_TASK_INDEX.txt" if lines else "/dev/null"
    doc = {
        "version": 1,
        "name": "cb-bench",
        "hosts": [{"address": f"10.0.0.{i + 1}"} for i in range(TASKS)],
        "job": {
            "command": ["sh", "-c", f"exec cat {src}"],
            "startup_timeout_s": 60,
            "remote_dir": str(work / "remote"),
        },
        "heartbeat": {"profile_interval_s": 0},
    }
    loaded = load_spec_text(yaml.safe_dump(doc), "bench.yaml")
    plan = ssh_plan(loaded.spec, run_id="cb-bench", local_user="me", ssh_lookup=None)

    class LocalNodes(ConnectBackBackend):
        name = "bench-connect-back"

        def __init__(self) -> None:
            super().__init__(bind=("127.0.0.1", 0))
            self.procs: list[subprocess.Popen] = []

        def launch(self, starts) -> None:
            for rank, _ in enumerate(starts):
                env = {**os.environ, **self.connect_env(), p.Env.RANK: str(rank), "PYTHONPATH": str(REPO)}
                proc = subprocess.Popen([PY, __file__, "--node", mode], env=env, stdin=subprocess.PIPE)
                proc.stdin.write(self.secret_input())
                proc.stdin.close()
                self.procs.append(proc)

        def close(self) -> None:
            super().close()
            for proc in self.procs:
                proc.wait()

    run = work / f"run-{mode}-{lines}-{os.getpid()}"
    result = Job(
        loaded, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), LocalNodes()
    ).run()
    lost = 0
    for i in range(TASKS):
        data = (run / "logs" / f"worker-{i}.log").read_bytes() if lines else b""
        want = expected_bytes(lines, f"w{i}") if lines else b""
        lost += (
            0 if hashlib.sha256(data).digest() == hashlib.sha256(want).digest() else max(1, lines - data.count(b"\n"))
        )
    return {"state": result.state.value, "lost": lost}


def measure(mode: str, lines: int, work: Path) -> dict:
    m = run_measured([PY, __file__, "--one", mode, str(lines), "--work", str(work)], timeout=600)
    if m.rc != 0:
        raise RuntimeError(f"{mode} launch failed ({m.rc}): {m.stderr[-2000:]}")
    out = json.loads(m.stdout.strip().splitlines()[-1])
    if out["state"] != "succeeded":
        raise RuntimeError(f"{mode} launch ended {out['state']}: {m.stderr[-2000:]}")
    return {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "lost": out["lost"]}


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--node":
        return node(sys.argv[2])
    if len(sys.argv) >= 4 and sys.argv[1] == "--one":
        work = Path(sys.argv[sys.argv.index("--work") + 1]) if "--work" in sys.argv else None
        with tempfile.TemporaryDirectory(prefix="bench-cb-") as wd:
            work = work or Path(wd)
            lines = int(sys.argv[3])
            for i in range(TASKS):
                if lines and not (work / f"lines-{i}.txt").exists():
                    (work / f"lines-{i}.txt").write_bytes(expected_bytes(lines, f"w{i}"))
            print(json.dumps(one(sys.argv[2], lines, work)))
        return 0
    ap = base_parser(__doc__)
    ap.add_argument("--lines", type=int, default=None, help="lines per task (default 300000, quick 100000)")
    args = ap.parse_args()
    set_verbose(args.verbose)
    n = args.lines or (100_000 if args.quick else 300_000)
    reps = args.repeat or (1 if args.quick else 5)
    configs = [("sealed", n), ("plain", n), ("sealed", 0), ("plain", 0)]
    res: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="bench-cb-") as wd:
        work = Path(wd)
        for i in range(TASKS):
            (work / f"lines-{i}.txt").write_bytes(expected_bytes(n, f"w{i}"))
        measure("sealed", n, work)  # warm caches
        for rep in range(reps):
            for mode, lines in configs if rep % 2 == 0 else list(reversed(configs)):
                res[(mode, lines)].append(measure(mode, lines, work))
            say(
                f"repetition {rep + 1}/{reps}: sealed {res[('sealed', n)][-1]['wall_s']:.2f}s, "
                f"plain {res[('plain', n)][-1]['wall_s']:.2f}s"
            )
    total = TASKS * n
    mb = total * LINE_BYTES / 1e6
    rows = []
    for mode in ("sealed", "plain"):
        full = median([r["wall_s"] for r in res[(mode, n)]])
        empty = median([r["wall_s"] for r in res[(mode, 0)]])
        rows.append(
            {
                "mode": mode,
                "lines": total,
                "wall_s": full,
                "empty_s": empty,
                "lines_per_s": total / full,
                "marginal_lines_per_s": total / (full - empty) if full > empty else None,
                "marginal_mb_per_s": mb / (full - empty) if full > empty else None,
                "cpu_s": median([r["cpu_s"] for r in res[(mode, n)]]),
                "cpu_empty_s": median([r["cpu_s"] for r in res[(mode, 0)]]),
                "lost": sum(r["lost"] for r in res[(mode, n)]),
            }
        )
    columns = [
        ("mode", "channel"),
        ("lines", "lines"),
        ("wall_s", "wall s"),
        ("empty_s", "empty run s"),
        ("lines_per_s", "lines/s end-to-end"),
        ("marginal_lines_per_s", "lines/s marginal"),
        ("marginal_mb_per_s", "MB/s marginal"),
        ("cpu_s", "CPU s"),
        ("cpu_empty_s", "CPU s empty"),
        ("lost", "lines lost"),
    ]
    title = f"connect-back log throughput: {TASKS} local nodes x {n:,} lines of {LINE_BYTES} B ({mb:.0f} MB), loopback"
    report = Report(title, columns, rows=rows)
    report.notes.append(
        f"median of {reps}, ABBA order; each launch one process (Python start, handshakes, streaming, teardown)"
    )
    report.notes.append(
        "CPU: the launcher process and its 3 nodes (os.wait4 rusage); plain = the same code, null cipher"
    )
    report.data = {"raw": {f"{m} {lines}": v for (m, lines), v in res.items()}, "lines_per_task": n}
    sealed, plain = rows[0]["marginal_lines_per_s"], rows[1]["marginal_lines_per_s"]
    ratio = sealed / plain if sealed and plain else None
    lost = rows[0]["lost"] + rows[1]["lost"]
    report.set_ratio(
        "sealed / plain lines/s (marginal)",
        ratio,
        ">= 0.8, with 0 lines lost",
        ratio is not None and ratio >= 0.8 and lost == 0,
    )
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
