#!/usr/bin/env python3
"""One supervisor for thousands of tasks: launcher CPU, RSS and latencies at 3, 1,024 and 4,096 tasks.

    python bench/supervisor_scale.py [--sizes 3,1024,4096] [--seconds 30] [--slurm] [--quick] [--json]

Load-generator sizes: the launcher is ``tests/loadfleet.py`` (a real ``Job``/``Supervisor`` over
connect-back TCP; the nodes are ``tfcluster_testbed.loadgen``, a separate process speaking the real
protocol). Every node: 1 Hz heartbeats (with progress and host samples), a step-clock profile window
every 5 s, a log line every 10 s. Measured, per size:

* **to all running**: the launcher's fork → the last ``task_spawned`` (every node dialed, proved the
  secret, said hello, passed the checks and got its go);
* **CPU % of a core, RSS**: the launcher process alone (``/proc/PID/stat`` utime+stime over
  ``--seconds`` of steady state, children excluded; max VmRSS sampled every second);
* **heartbeat → status**: a node sends an extra heartbeat whose state is a marker (``mark`` cue);
  until status.json's snapshot (its ``updated``) shows it; 5 marks, median and max;
* **death → teardown**: a node's training process dies (``kill`` cue: its ``exited`` with SIGKILL) →
  the ``teardown`` event.

``--slurm`` (root, slurm-wlm + munge): 258 real ``worker_entry`` tasks (3 local slurmd x 86, the
command ``sleep 30``) under one supervisor launched from the login node: the batch job's supervisor
(launcher.json's pid) measured the same way; the job must succeed.

The box has 2 cores shared by the launcher, the generator (or 258 worker_entry processes) and
whatever else runs: the launcher's own CPU is the figure, the load average is printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import views_scale
from common import PY, REPO, Report, WaitTimeout, base_parser, fleet_traffic, say, set_verbose, wait_for

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)
    return None


def rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


class EventTail:
    """events.jsonl read incrementally (the bench must not re-read 4,096 tasks' events every poll)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.events: list[dict] = []
        self._part = b""

    def poll(self) -> list[dict]:
        with contextlib.suppress(OSError), open(self.path, "rb") as f:
            f.seek(self.pos)
            data = self._part + f.read()
            self.pos = f.tell()
            *lines, self._part = data.split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    self.events.append(json.loads(line))
        return self.events

    def count(self, kind: str) -> int:
        return sum(1 for e in self.poll() if e.get("event") == kind)


def why_failed(d: Path, keep: Path | None = None) -> str:
    """Why the launcher in ``d`` ended before every task ran: result.json's root cause, the last failure
    events, the launcher's stderr tail; and ``d``'s evidence copied to ``keep`` (it is in a temporary
    directory that is about to go), so a start that failed once in four can be read afterwards."""
    run_dir = d / "run"
    parts = []
    with contextlib.suppress(OSError, ValueError):
        res = json.loads((run_dir / "result.json").read_text())
        parts.append(f"state {res.get('state')}, root cause {json.dumps(res.get('root_cause'))[:600]}")
    with contextlib.suppress(OSError):
        evs = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
        kinds: dict[str, int] = {}
        for e in evs:
            kinds[e.get("event", "?")] = kinds.get(e.get("event", "?"), 0) + 1
        parts.append("events " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        bad = [
            e
            for e in evs
            if e.get("event") in ("task_exited", "task_lost", "startup_timeout", "interrupted", "teardown")
        ]
        parts.extend(json.dumps(e)[:300] for e in bad[:3])
    with contextlib.suppress(OSError):
        parts.append("launcher stderr: " + (d / "launcher.err").read_text(errors="replace")[-400:])
    dest = (keep or Path(tempfile.mkdtemp(prefix="tfc-failed-"))) / f"{d.name}-{time.strftime('%H%M%S')}"
    with contextlib.suppress(OSError):
        shutil.copytree(d, dest, ignore=shutil.ignore_patterns("logs", "cues", "*.tfevents*", "tensorboard"))
        parts.append(f"kept in {dest}")
    return "; ".join(parts)


def gen_events(path: Path) -> list[dict]:
    with contextlib.suppress(OSError):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return []


def wait_gen(path: Path, pred, timeout: float, what: str) -> dict:
    """The generator's first event ``pred`` holds for (``wait_for``: a timeout fails the size, saying ``what``)."""
    return wait_for(lambda: next((e for e in gen_events(path) if pred(e)), None), timeout, what, interval=0.05)


def measure(proc_pid: int, seconds: float) -> tuple[float, float]:
    """(CPU % of one core, max RSS MB) of ``proc_pid`` over ``seconds``."""
    c0, t0, peak = cpu_s(proc_pid), time.monotonic(), 0.0
    while time.monotonic() - t0 < seconds:
        peak = max(peak, rss_mb(proc_pid) or 0.0)
        time.sleep(1.0)
    c1, t1 = cpu_s(proc_pid), time.monotonic()
    return (100.0 * (c1 - c0) / (t1 - t0) if c0 is not None and c1 is not None else float("nan")), peak


def mark_latency(run_dir: Path, gen_file: Path, cues, ranks: list[int]) -> list[float]:
    """Per rank: its marker heartbeat's send → the status snapshot that shows it."""
    out = []
    for rank in ranks:
        cues.write(f"mark {rank}\n")
        cues.flush()
        sent = wait_gen(
            gen_file,
            lambda e, r=rank: e.get("fault") == "mark" and e.get("rank") == r,
            10,
            f"rank {rank}'s marker sent",
        )

        def shown(r: int = rank) -> dict | None:
            with contextlib.suppress(OSError, ValueError):
                data = (run_dir / "status.json").read_bytes()
                if b'"mark-' in data:
                    st = json.loads(data)
                    if (st["tasks"].get(f"worker:{r}") or {}).get("proc_state", "").startswith("mark-"):
                        return st
            return None

        st = wait_for(shown, 30, f"status.json showing worker:{rank}'s marker", interval=0.05)
        out.append(st["updated"] - sent["ts"])
        time.sleep(0.5)
    return out


def one_size(
    n: int,
    seconds: float,
    work: Path,
    *,
    views: bool = False,
    hb_timeout: float = 10.0,
    keep: Path | None = None,
    interval: float = 1.0,
) -> dict:
    d = work / f"n{n}"
    d.mkdir()
    os.mkfifo(d / "cues")
    gen_file = d / "gen.jsonl"
    run_dir = d / "run"
    argv = [
        PY,
        str(REPO / "tests" / "loadfleet.py"),
        "--tasks",
        str(n),
        "--run-dir",
        str(run_dir),
        "--cues",
        str(d / "cues"),
        "--gen-events",
        str(gen_file),
        *fleet_traffic(interval),
        "--timeout",
        str(hb_timeout),
        *(["--metrics"] if views else []),
    ]
    fork = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(d / "launcher.err", "wb"))  # noqa: SIM115
    cues = open(d / "cues", "w")  # noqa: SIM115 - blocks until the generator opens it
    row: dict = {"tasks": n}
    try:
        tail = EventTail(run_dir / "events.jsonl")
        wait_for(
            lambda: tail.count("task_spawned") >= n or proc.poll() is not None,
            600,
            f"{n} task_spawned events (or the launcher's exit)",
            interval=0.5,
        )
        spawned = [e["ts"] for e in tail.poll() if e.get("event") == "task_spawned"]
        if len(spawned) < n:
            proc.wait(120)  # result.json is written as it ends
            raise RuntimeError(f"{n} tasks: only {len(spawned)} running; {why_failed(d, keep)}")
        row["to_running_s"] = round(max(spawned) - fork, 2)
        time.sleep(3)
        row["cpu_pct"], row["rss_mb"] = (round(x, 1) for x in measure(proc.pid, seconds))
        url = next((e.get("url") for e in tail.poll() if e.get("event") == "metrics"), None)
        if views and url:
            row.update(views_scale.metrics_page(url))
        lat = mark_latency(run_dir, gen_file, cues, [n // 7, n // 3, n // 2, (2 * n) // 3, n - 1][: min(5, n)])
        row["hb_to_status_s"] = round(statistics.median(lat), 2) if lat else None
        row["hb_to_status_max_s"] = round(max(lat), 2) if lat else None
        victim = n // 2
        cues.write(f"kill {victim}\n")
        cues.flush()
        died = wait_gen(gen_file, lambda e: e.get("fault") == "kill", 30, f"worker:{victim}'s kill")
        teardown = wait_for(
            lambda: next((e for e in tail.poll() if e.get("event") == "teardown"), None),
            60,
            "the launcher's teardown after the kill",
            interval=0.05,
        )
        row["death_to_teardown_s"] = round(teardown["ts"] - died["ts"], 3)
        proc.wait(300)
        row["launcher_wall_s"] = round(time.time() - fork, 1)
        row["state"] = json.loads((run_dir / "result.json").read_text())["state"]
        if views:
            row.update(views_scale.views(run_dir, d))
    finally:
        with contextlib.suppress(OSError):
            cues.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return row


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--sizes", default="3,1024,4096")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--slurm", action="store_true", help="also 258 real worker_entry tasks under a local Slurm")
    ap.add_argument(
        "--hb-timeout",
        type=float,
        default=10.0,
        help="the spec's heartbeat timeout (a box loaded by others can starve the one generator process past 10 s)",
    )
    ap.add_argument(
        "--keep", help="a directory where a failed size's run directory is copied (default: a new tfc-failed-* in /tmp)"
    )
    ap.add_argument("--views", action="store_true", help="also every command on each run (bench/views_scale.py)")
    ap.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="the heartbeat interval in seconds (a step-clock window every 5): 4 at 16,384 tasks sends what "
        "4,096 send at 1 Hz, which one 2-core box's generator can keep up with",
    )
    args = ap.parse_args()
    set_verbose(args.verbose)
    seconds = 10.0 if args.quick else args.seconds
    sizes = [int(x) for x in args.sizes.split(",")] if not args.quick else [3, 256]
    rows = []
    keep = Path(args.keep) if args.keep else None
    with tempfile.TemporaryDirectory(prefix="tfc-scale-") as tmp:
        for n in sizes:
            say(f"{n} load-generator tasks ...")
            try:
                row = one_size(
                    n,
                    seconds,
                    Path(tmp),
                    views=args.views,
                    hb_timeout=args.hb_timeout,
                    keep=keep,
                    interval=args.interval,
                )
            except (OSError, RuntimeError, WaitTimeout) as exc:  # one size that failed says why; the others still run
                err = Path(tmp) / f"n{n}" / "launcher.err"
                tail = err.read_text(errors="replace")[-600:] if err.exists() else ""
                say(f"{n} tasks failed: {exc!r}; launcher stderr: {tail}")
                row = {"tasks": n, "state": f"error: {exc!r}"[:80]}
            rows.append({"method": "load generator", **row})
        if args.slurm:
            from slurm_scale import slurm_258

            say("258 tasks under a local Slurm ...")
            rows.append({"method": "Slurm, real worker_entry", **slurm_258(Path(tmp), seconds)})
    for r in rows:
        r["hb_to_status"] = f"{r.get('hb_to_status_s')} / {r.get('hb_to_status_max_s')}"
    columns = [
        ("method", "method"),
        ("tasks", "tasks"),
        ("to_running_s", "to running s"),
        ("cpu_pct", "CPU % of a core"),
        ("rss_mb", "RSS MB"),
        ("hb_to_status", "hb→status s (median / max)"),
        ("death_to_teardown_s", "death→teardown s"),
        ("launcher_wall_s", "launcher wall s"),
        ("state", "state"),
    ]
    report = Report(f"supervisor scale: one launcher, N tasks, a heartbeat every {args.interval:g} s", columns, rows)
    if args.views:
        report.notes.extend(views_scale.table(rows))
    big = next((r for r in rows if r["tasks"] == 1024), None)
    if big is not None:
        report.notes.append(
            f"at 1,024 tasks: {big.get('cpu_pct')} % of a core (target <= 25), {big.get('rss_mb')} MB "
            f"(<= 1024), death -> teardown {big.get('death_to_teardown_s')} s (<= 2)"
        )
        cpu = big.get("cpu_pct")
        report.set_ratio(
            "launcher CPU at 1,024 tasks, fraction of a core",
            cpu / 100 if cpu is not None else None,
            "<= 0.25",
            cpu is not None and cpu <= 25,
        )
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
