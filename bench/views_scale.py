#!/usr/bin/env python3
"""Every command on a large run's directory: ``status``, ``status --json``, ``report``, ``report --html``,
``logs --task``, the gather's bookkeeping, TensorBoard and metrics cardinality.

A synthetic run (``--synthetic``) gets the RUN/summary.json a real run's end writes (``summary_cpu_s``:
what writing it cost, once), so ``report`` reads it; ``--no-summary`` measures the records' path.

    python bench/views_scale.py RUN [RUN ...] [--json]

Used by ``bench/supervisor_scale.py --views`` on the run directory each load-generator size leaves (N
tasks, ~``--seconds`` of 1 Hz heartbeats, a profile window every 5 s, a log line every 10 s per task,
one task killed at the end), or by hand on any run directory. Each command is its own
``python -m orchestrator`` process: CPU seconds (user + system, ``wait4``) are the figure to compare on
this shared box, wall time and peak RSS beside them. From the run's own records:

* **gather**: ``gather_started`` → ``gather_finished`` (the hand-over's bookkeeping of N tasks at the
  job's end), and the attempt's end → ``job_finished``;
* **TensorBoard**: runs (one per task + ``job``), event files, records and bytes under RUN/tensorboard;
* **metrics**: the series (lines without ``#``) and bytes of one ``/metrics`` page, read while the job
  ran (``supervisor_scale`` reads it; ``metrics_page`` here counts one).
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO

COMMANDS = {
    "status": ["status"],
    "status_json": ["status", "--json"],
    "report": ["report"],
    "report_html": ["report", "--html"],
    "logs_task": ["logs", "--task", "worker:1"],
}


def run_cmd(argv: list[str], out: Path, timeout: float = 600) -> dict[str, Any]:
    """Wall, CPU (user + system of the command, wait4) and peak RSS of one command; its exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    start = time.monotonic()
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.02)
    return {
        "wall_s": round(time.monotonic() - start, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rss_mb": round(usage.ru_maxrss / 1024, 1),
        "rc": os.waitstatus_to_exitcode(status),
        "bytes": out.stat().st_size,
    }


def events(run: Path) -> list[dict[str, Any]]:
    out = []
    with open(run / "events.jsonl", "rb") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def gather_figures(run: Path) -> dict[str, Any]:
    """The gather's bookkeeping from events.jsonl: its own span, and the attempt's end to the job's."""
    ts: dict[str, float] = {}
    for e in events(run):
        if e.get("event") in ("attempt_finished", "gather_started", "gather_finished", "job_finished"):
            ts.setdefault(e["event"], e["ts"])
    span = lambda a, b: round(ts[b] - ts[a], 3) if a in ts and b in ts else None  # noqa: E731
    return {
        "gather_s": span("gather_started", "gather_finished"),
        "attempt_end_to_job_end_s": span("attempt_finished", "job_finished"),
    }


def tensorboard_figures(run: Path) -> dict[str, Any]:
    """TensorBoard's cardinality: runs, event files, TFRecord records (events) and bytes."""
    root = run / "tensorboard"
    files = [p for p in root.rglob("events.out.tfevents.*") if p.is_file()] if root.is_dir() else []
    records = 0
    for p in files:
        data = p.read_bytes()
        pos = 0
        while pos + 12 <= len(data):  # TFRecord: u64 length, u32 crc, data, u32 crc
            (length,) = struct.unpack_from("<Q", data, pos)
            pos += 12 + length + 4
            records += 1
    return {
        "tb_runs": len({p.parent for p in files}),
        "tb_files": len(files),
        "tb_records": records,
        "tb_mb": round(sum(p.stat().st_size for p in files) / 1e6, 2),
    }


def metrics_page(url: str) -> dict[str, Any]:
    """One scrape of the launcher's /metrics: its time, bytes and series."""
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as r:  # the launcher's loopback URL
        body = r.read()
    lines = [ln for ln in body.decode(errors="replace").splitlines() if ln and not ln.startswith("#")]
    return {
        "metrics_s": round(time.monotonic() - start, 3),
        "metrics_series": len(lines),
        "metrics_kb": len(body) // 1024,
    }


def views(run: Path, work: Path) -> dict[str, Any]:
    """Every command's figures on ``run`` (outputs under ``work``), then the run's own figures."""
    row: dict[str, Any] = {}
    for name, args in COMMANDS.items():
        row[name] = run_cmd([PY, "-m", "orchestrator", *args[:1], str(run), *args[1:]], work / f"{name}.out")
    sizes = {
        "heartbeats_mb": run / "heartbeats.jsonl",
        "events_mb": run / "events.jsonl",
        "status_mb": run / "status.json",
        "summary_mb": run / "summary.json",
        "combined_mb": run / "combined.log",
    }
    for key, path in sizes.items():
        row[key] = round(path.stat().st_size / 1e6, 2) if path.exists() else None
    return row | gather_figures(run) | tensorboard_figures(run)


def exponent(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of log y against log N (1: linear, 0: flat); None under two points."""
    pts = [(math.log(n), math.log(y)) for n, y in points if n > 0 and y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / den, 2) if den else None


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The views at every size, one line per figure: value per size and the log-log growth exponent."""
    rows = sorted((r for r in rows if "status" in r), key=lambda r: r["tasks"])
    if not rows:
        return []
    sizes = [r["tasks"] for r in rows]
    lines = ["views (CPU s / wall s / peak MB per size; exponent of CPU and of MB):"]
    lines.append("  " + "figure".ljust(22) + "".join(f"{n:>22}" for n in sizes) + "   exp cpu  exp MB")
    for name in COMMANDS:
        cells = [r[name] for r in rows]
        text = "".join(f"{c['cpu_s']:>8.2f} /{c['wall_s']:>6.2f} /{c['rss_mb']:>5.0f}" for c in cells)
        e_cpu = exponent([(n, c["cpu_s"]) for n, c in zip(sizes, cells, strict=True)])
        e_mb = exponent([(n, c["rss_mb"]) for n, c in zip(sizes, cells, strict=True)])
        bad = [f"rc {c['rc']} at {n}" for n, c in zip(sizes, cells, strict=True) if c["rc"] != 0]
        lines.append(f"  {name:<22}{text}   {e_cpu!s:>7} {e_mb!s:>7}" + (f"  ({', '.join(bad)})" if bad else ""))
    for key in (
        "summary_cpu_s",
        "gather_s",
        "attempt_end_to_job_end_s",
        "tb_runs",
        "tb_files",
        "tb_records",
        "tb_mb",
        "metrics_s",
        "metrics_series",
        "metrics_kb",
        "heartbeats_mb",
        "events_mb",
        "status_mb",
        "summary_mb",
    ):
        vals = [r.get(key) for r in rows]
        e = exponent([(n, v) for n, v in zip(sizes, vals, strict=True) if v is not None])
        lines.append(f"  {key:<22}" + "".join(f"{v!s:>22}" for v in vals) + f"   {e!s:>7}")
    return lines


def main() -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*")
    ap.add_argument(
        "--synthetic",
        help="SIZES (256,1024,4096): also tests/bigrun.py's finished N-task runs (the recorded 3-worker run's "
        "records copied to N workers, 46 heartbeat records each), made here",
    )
    ap.add_argument(
        "--no-summary",
        action="store_true",
        help="leave the synthetic runs without RUN/summary.json: report reads every record (the fallback)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfc-views-") as tmp:
        for run in args.runs:
            rows.append({"run": run, "tasks": _tasks(Path(run)), **views(Path(run), Path(tmp))})
        for n in [int(x) for x in args.synthetic.split(",")] if args.synthetic else []:
            sys.path.insert(0, str(REPO / "tests"))
            from bigrun import big_run

            start = time.monotonic()
            run = big_run(Path(tmp) / f"synthetic{n}", n)
            made = round(time.monotonic() - start, 1)
            print(f"synthetic run of {n} tasks made in {made} s", file=sys.stderr, flush=True)
            row: dict[str, Any] = {"run": f"synthetic {n}", "tasks": n}
            if not args.no_summary:  # what a real run's end writes (cli.commands.after_run): its CPU, once
                row["summary_cpu_s"] = _summarise(run)
            rows.append(row | views(run, Path(tmp)))
    if args.json:
        print(json.dumps(rows))
    else:
        print("\n".join(table(rows)))
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


def _summarise(run: Path) -> float:
    """RUN/summary.json written as the run's end writes it; the CPU seconds it took."""
    sys.path.insert(0, str(REPO))
    from orchestrator.runs import RunDir
    from orchestrator.views.runsummary import summarise

    start = time.process_time()
    summarise(RunDir(run))
    return round(time.process_time() - start, 2)


def _tasks(run: Path) -> int:
    try:
        return len(json.loads((run / "result.json").read_text()).get("tasks", {}))
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
