#!/usr/bin/env python3
"""Log throughput: lines/s aggregated from 3 workers through `tfcluster launch -q` vs `ssh host cat`.

    python bench/logs_throughput.py [--quick] [--json] [--repeat N] [--lines 300000]

Loopback test bed, 3 hosts. Each worker prints --lines lines of 60 bytes as fast as it can: the
producer is `cat` of a pre-written file on both sides (the job command is `sh -c 'exec cat FILE'`),
so only the transport differs. tfcluster: `launch -q --no-gather`; every line must be in
RUN/logs/worker-N.log (checked byte for byte by sha256) and in combined.log (counted): lines lost
must be 0. Baseline: the same bytes pre-written to a file per host, fetched by 3 parallel OpenSSH
clients `ssh hostN cat FILE > out` (same test bed hosts, key, strict host-key checking).

Both are reported end to end (wall time of the command: connection, login shell, and for tfcluster
Python start, worker_entry hello/go and teardown) and marginal (minus the same command moving no
lines: `launch -- true`, `ssh hostN cat /dev/null`), which is the streaming rate itself.
Order alternates (ABBA). Ratio printed last: tfcluster / ssh cat, end-to-end lines/s (target >= 0.5).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    Report,
    base_parser,
    events,
    first_ts,
    last_ts,
    launcher_argv,
    launcher_env,
    median,
    run_measured,
    say,
    set_verbose,
    testbed,
    write_ssh_config,
)

LINE_BYTES = 60


def expected_bytes(n: int, tag: str) -> bytes:
    fmt = tag + " line %010d " + "x" * 60
    return b"".join((fmt % i)[:59].encode() + b"\n" for i in range(n))


def run_tfcluster(tb, work: Path, n: int, tag: str, expect: list[str] | None) -> dict:
    # Same producer as the baseline: `cat` of the pre-written file of this task (the task index comes
    # from the environment; the job's own `sh -c` expands it, tfcluster passes argv without a shell).
    src = f"{tb.dir}/lines-$TFCLUSTER_TASK_INDEX.txt" if n else "/dev/null"
    cmd = ["sh", "-c", f"exec cat {src}"]
    spec = tb.write_spec(work / f"logs-{tag}.yaml", "logs", cmd, job={"remote_dir": str(tb.dir / "remote")})
    run_dir = work / f"run-{tag}"
    m = run_measured(
        launcher_argv(tb, "launch", str(spec), "--run-dir", str(run_dir), "-q", "--no-gather"),
        env=launcher_env(),
        timeout=600,
    )
    if m.rc != 0:
        raise RuntimeError(f"launch failed ({m.rc}): {m.stderr[-2000:]}")
    evs = events(run_dir)
    lost = 0
    combined = 0
    if n:
        for i in range(3):
            data = (run_dir / "logs" / f"worker-{i}.log").read_bytes()
            got = data.count(b"\n")
            lost += max(0, n - got)
            if expect is not None and hashlib.sha256(data).hexdigest() != expect[i]:
                lost += 1 if got == n else 0  # same count but different bytes: corrupted
                say(f"worker-{i}.log differs from what the worker printed ({got} lines)")
        with open(run_dir / "combined.log", "rb") as f:
            for line in f:
                if b" [worker:" in line[:64]:
                    combined += 1
    stream = (last_ts(evs, "task_exited") or 0) - (first_ts(evs, "task_spawned") or 0)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "wall_s": m.wall_s,
        "stream_s": stream,
        "cpu_s": m.cpu_s,
        "lost": lost,
        "combined_lines": combined,
        "maxrss_mb": m.maxrss_mb,
    }


def run_ssh(tb, work: Path, files: list[Path] | None, cfg: Path, tag: str) -> dict:
    outs = [work / f"ssh-{tag}-{i}.out" for i in range(3)]
    srcs = [str(f) for f in files] if files else ["/dev/null"] * 3
    script = "".join(f"ssh -F {cfg} {h.name} cat {s} > {o} &\n" for h, s, o in zip(tb.hosts, srcs, outs, strict=True))
    m = run_measured(["bash", "-c", script + "wait\n"], timeout=600)
    if m.rc != 0:
        raise RuntimeError(f"ssh cat failed: {m.stderr[-1000:]}")
    lost = 0
    if files:
        for f, o in zip(files, outs, strict=True):
            if o.stat().st_size != f.stat().st_size:
                lost += 1
    for o in outs:
        o.unlink(missing_ok=True)
    return {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "lost": lost}


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--lines", type=int, default=None, help="lines per worker (default 300000, quick 100000)")
    args = ap.parse_args()
    set_verbose(args.verbose)
    n = args.lines or (100_000 if args.quick else 300_000)
    reps = args.repeat or (1 if args.quick else 3)
    res: dict[str, list[dict]] = {"tfcluster": [], "ssh cat": [], "tfcluster empty": [], "ssh cat empty": []}
    with tempfile.TemporaryDirectory(prefix="bench-logs-") as wd, testbed(3, mode="loopback") as tb:
        work = Path(wd)
        cfg = work / "ssh_config"
        write_ssh_config(tb, cfg)
        files, expect = [], []
        for i in range(3):
            data = expected_bytes(n, f"w{i}")
            p = tb.dir / f"lines-{i}.txt"
            p.write_bytes(data)
            files.append(p)
            expect.append(hashlib.sha256(data).hexdigest())
        assert len(data) == n * LINE_BYTES
        run_tfcluster(tb, work, n, "warm", None)  # warm caches
        for rep in range(reps):
            order = ["tfcluster", "ssh cat", "tfcluster empty", "ssh cat empty"]
            if rep % 2:
                order.reverse()
            for what in order:
                if what == "tfcluster":
                    r = run_tfcluster(tb, work, n, f"{rep}", expect)
                elif what == "tfcluster empty":
                    r = run_tfcluster(tb, work, 0, f"{rep}e", None)
                elif what == "ssh cat":
                    r = run_ssh(tb, work, files, cfg, f"{rep}")
                else:
                    r = run_ssh(tb, work, None, cfg, f"{rep}e")
                res[what].append(r)
            say(
                f"repetition {rep + 1}/{reps}: tfcluster {res['tfcluster'][-1]['wall_s']:.2f}s, ssh cat {res['ssh cat'][-1]['wall_s']:.2f}s"
            )
    total = 3 * n
    mb = total * LINE_BYTES / 1e6
    rows = []
    for name in ("tfcluster", "ssh cat"):
        full = median([r["wall_s"] for r in res[name]])
        empty = median([r["wall_s"] for r in res[f"{name} empty"]])
        rows.append(
            {
                "method": name,
                "lines": total,
                "wall_s": full,
                "empty_s": empty,
                "lines_per_s": total / full,
                "marginal_lines_per_s": total / (full - empty) if full > empty else None,
                "mb_per_s": mb / full,
                "cpu_s": median([r["cpu_s"] for r in res[name]]),
                "lost": sum(r["lost"] for r in res[name]),
            }
        )
    stream = median([r["stream_s"] for r in res["tfcluster"]])
    report = Report(
        f"log throughput: 3 workers x {n:,} lines of {LINE_BYTES} B ({mb:.0f} MB), loopback test bed",
        [
            ("method", "method"),
            ("lines", "lines"),
            ("wall_s", "wall s"),
            ("empty_s", "empty run s"),
            ("lines_per_s", "lines/s end-to-end"),
            ("marginal_lines_per_s", "lines/s marginal"),
            ("mb_per_s", "MB/s end-to-end"),
            ("cpu_s", "client CPU s"),
            ("lost", "lines lost"),
        ],
        rows=rows,
    )
    report.notes.append(
        f"median of {reps}, ABBA order; tfcluster streaming window (first task_spawned -> last task_exited) "
        f"{stream:.2f}s = {total / stream:,.0f} lines/s; combined.log held "
        f"{min(r['combined_lines'] for r in res['tfcluster']):,} of {total:,} lines in every run"
    )
    report.notes.append("client CPU: the launcher process / the 3 ssh clients (os.wait4 rusage)")
    report.data = {"raw": res, "lines_per_worker": n}
    lost = rows[0]["lost"] + sum(total - r["combined_lines"] for r in res["tfcluster"])
    ratio = rows[0]["lines_per_s"] / rows[1]["lines_per_s"]
    report.notes.append(f"lines lost through tfcluster (per-task logs + combined.log, all runs): {lost}")
    report.set_ratio(
        "tfcluster / ssh cat lines/s (end-to-end)", ratio, ">= 0.5, with 0 lines lost", ratio >= 0.5 and lost == 0
    )
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
