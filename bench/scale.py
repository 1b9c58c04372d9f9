#!/usr/bin/env python3
"""Scale: one launcher supervising 64 hosts heartbeating at 1 Hz; and the cost of a heartbeat.

    python bench/scale.py [--quick] [--json] [--hosts 64] [--seconds 60]

Part A (64 loopback hosts, `Testbed(64, mode="loopback", single_sshd=True)`): the job is `sleep`
on every host (worker_entry heartbeats by itself, 1 Hz: heartbeat.interval_s 1). The launcher
process alone (psutil on its pid, sampled every second, children excluded) over --seconds of steady
state (quick: 20 s) after the last `task_spawned`: CPU % of one core and max RSS; launch time
(fork -> last `task_spawned`). Side by side: the same 64 hosts held by 64 OpenSSH clients running
`sleep` (their summed CPU and RSS over the same length of time), the floor for "64 sessions open".
Also the CPU of the 64 worker_entry processes (per host, ms per second) at 1 Hz.

Part B (4 hosts of the same bed): worker_entry CPU with heartbeat.interval_s 0.1 vs 1.0 over the
same window -> CPU per heartbeat on the node, and launcher CPU per heartbeat received.

Targets: launcher < 25 % of one core and < 300 MB RSS at 64 hosts. Ratio printed last: launcher
CPU as a fraction of one core at 64 hosts (target < 0.25).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PY,
    Report,
    base_parser,
    events,
    last_ts,
    launcher_env,
    say,
    set_verbose,
    testbed,
    wait_for,
    write_ssh_config,
)


def worker_entries(tb, hosts) -> list[psutil.Process]:
    names = {h.name for h in hosts}
    out = []
    for name, procs in tb.processes_by_host(hosts).items():
        if name not in names:
            continue
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if "worker_entry" in " ".join(p.cmdline()):
                    out.append(p)
    return out


def cpu_of(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
    return out


def supervise(tb, work: Path, hosts, interval: float, seconds: float, tag: str) -> dict:
    """Launch `sleep` on `hosts`, measure launcher + worker_entry over `seconds` of steady state."""
    n = len(hosts)
    spec = tb.spec_dict(f"scale{n}", ["sleep", str(int(seconds + 600))], job={"remote_dir": str(tb.dir / "remote")})
    spec["hosts"] = spec["hosts"][:n]
    spec["heartbeat"] = {"interval_s": interval, "timeout_s": 30}
    spec_path = work / f"scale-{tag}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_dir = work / f"run-{tag}"
    t_start = time.time()
    t0 = time.monotonic()
    proc = tb.run_on_controller(
        [PY, "-m", "orchestrator", "launch", str(spec_path), "--run-dir", str(run_dir), "-q", "--no-gather"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=launcher_env(),
    )
    me = psutil.Process(proc.pid)
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(psutil.Error), me.oneshot():
                t = me.cpu_times()
                samples.append((time.monotonic(), t.user + t.system, me.memory_info().rss / 2**20))
            stop.wait(1.0)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:

        def spawned() -> bool:
            return sum(1 for e in events(run_dir) if e["event"] == "task_spawned") >= n or proc.poll() is not None

        wait_for(spawned, 300, f"{n} task_spawned events (or the launcher's exit)", interval=0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"launcher exited early ({proc.returncode}); see {run_dir}")
        launch_s = last_ts(events(run_dir), "task_spawned") - t_start
        time.sleep(3)  # settle: the last hellos, first heartbeats
        wes = worker_entries(tb, hosts)
        c0 = cpu_of(wes)
        w0 = time.monotonic()
        l0 = me.cpu_times()
        time.sleep(seconds)
        l1 = me.cpu_times()
        w1 = time.monotonic()
        c1 = cpu_of(wes)
        hb = run_dir / "heartbeats.jsonl"
        beats = hb.read_bytes().count(b"\n") if hb.exists() else 0
        state = [e for e in events(run_dir) if e["event"] in ("worker_lost", "worker_hung", "teardown")]
    finally:
        proc.terminate()  # SIGTERM: the launcher tears the job down cleanly
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stop.set()
        th.join(5)
    dt = w1 - w0
    lcpu = (l1.user + l1.system) - (l0.user + l0.system)
    we_cpu = sum(c1[p] - c0[p] for p in c1 if p in c0)
    return {
        "hosts": n,
        "interval_s": interval,
        "launch_s": launch_s,
        "window_s": dt,
        "launcher_cpu_pct": 100 * lcpu / dt,
        "launcher_cpu_s": lcpu,
        "launcher_max_rss_mb": max(s[2] for s in samples),
        "launcher_rss_end_mb": samples[-1][2] if samples else None,
        "worker_entry_ms_per_s_per_host": 1000 * we_cpu / dt / max(1, len(c0)),
        "worker_entries_measured": len(c0),
        "heartbeats_file_lines": beats,
        "problems": [f"{e['event']}: {e.get('message') or e.get('reason')}" for e in state],
        "seconds_total": time.monotonic() - t0,
    }


def ssh_clients(tb, work: Path, hosts, seconds: float) -> dict:
    """64 OpenSSH clients holding a session each (`sleep`): their summed CPU and RSS."""
    cfg = work / "ssh_config"
    write_ssh_config(tb, cfg)
    procs = [
        subprocess.Popen(
            ["ssh", "-F", str(cfg), h.name, f"sleep {int(seconds + 20)}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for h in hosts
    ]
    try:
        ps = [psutil.Process(p.pid) for p in procs]
        wait_for(lambda: len(worker_sleepers(tb, hosts)) >= len(hosts), 120, "a sleeper on every host", interval=0.2)
        time.sleep(2)
        c0 = cpu_of(ps)
        t0 = time.monotonic()
        rss = 0.0
        for _ in range(int(seconds)):
            time.sleep(1)
            cur = 0.0
            for p in ps:
                with contextlib.suppress(psutil.Error):
                    cur += p.memory_info().rss / 2**20
            rss = max(rss, cur)
        c1 = cpu_of(ps)
        dt = time.monotonic() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    cpu = sum(c1[p] - c0[p] for p in c1 if p in c0)
    return {"cpu_pct": 100 * cpu / dt, "rss_mb": rss, "window_s": dt}


def worker_sleepers(tb, hosts) -> list:
    out = []
    for procs in tb.processes_by_host(hosts).values():
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if p.name() == "sleep":
                    out.append(p)
    return out


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=None, help="steady-state window (default 60, quick 20)")
    args = ap.parse_args()
    set_verbose(args.verbose)
    secs = args.seconds or (20.0 if args.quick else 60.0)
    secs_b = 10.0 if args.quick else 20.0
    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-") as wd,
        testbed(args.hosts, mode="loopback", single_sshd=True) as tb,
    ):
        work = Path(wd)
        say(f"part A: {args.hosts} hosts, 1 Hz, {secs:g}s ...")
        a = supervise(tb, work, tb.hosts, 1.0, secs, "a")
        say(f"part A: launcher {a['launcher_cpu_pct']:.1f}% of a core, max RSS {a['launcher_max_rss_mb']:.0f} MB")
        wait_for(lambda: not worker_sleepers(tb, tb.hosts), 30, "part A's sleepers gone", interval=0.2)
        say(f"baseline: {args.hosts} OpenSSH clients holding a session, {secs:g}s ...")
        base = ssh_clients(tb, work, tb.hosts, secs)
        say("part B: heartbeat cost, 4 hosts, 0.1 s vs 1 s ...")
        b = {}
        for iv in (1.0, 0.1, 1.0, 0.1):
            r = supervise(tb, work, tb.hosts[:4], iv, secs_b, f"b{iv}-{len(b)}")
            b.setdefault(iv, []).append(r)
    report = Report(
        f"scale: one launcher, {args.hosts} loopback hosts (4 sshd), heartbeats at 1 Hz, {secs:g}s steady state",
        [
            ("what", "what"),
            ("cpu_pct", "CPU % of a core"),
            ("rss_mb", "RSS MB"),
            ("launch_s", "launch s"),
            ("note", "note"),
        ],
    )
    report.rows.append(
        {
            "what": "tfcluster launcher",
            "cpu_pct": a["launcher_cpu_pct"],
            "rss_mb": a["launcher_max_rss_mb"],
            "launch_s": a["launch_s"],
            "note": f"max of 1 s samples; {len(a['problems'])} verdicts",
        }
    )
    report.rows.append(
        {
            "what": f"{args.hosts} OpenSSH clients (sum)",
            "cpu_pct": base["cpu_pct"],
            "rss_mb": base["rss_mb"],
            "launch_s": None,
            "note": "each holding `sleep` open",
        }
    )
    report.rows.append(
        {
            "what": "worker_entry, per host",
            "cpu_pct": a["worker_entry_ms_per_s_per_host"] / 10,
            "rss_mb": None,
            "launch_s": None,
            "note": f"{a['worker_entry_ms_per_s_per_host']:.2f} ms CPU per s at 1 Hz ({a['worker_entries_measured']} measured)",
        }
    )

    def avg(iv: float, key: str) -> float:
        return sum(r[key] for r in b[iv]) / len(b[iv])

    we_fast, we_slow = avg(0.1, "worker_entry_ms_per_s_per_host"), avg(1.0, "worker_entry_ms_per_s_per_host")
    l_fast, l_slow = avg(0.1, "launcher_cpu_pct"), avg(1.0, "launcher_cpu_pct")
    per_beat_node = (we_fast - we_slow) / 9.0  # 10/s vs 1/s: 9 more heartbeats per second per host
    per_beat_launcher = (l_fast - l_slow) * 10 / (9.0 * 4)  # ms per heartbeat received (4 hosts)
    report.extra_tables.append(
        (
            "heartbeat cost (4 hosts, mean of 2 runs each, ABAB)",
            [("interval", "interval s"), ("we", "worker_entry ms CPU/s/host"), ("launcher", "launcher CPU %")],
            [
                {"interval": 1.0, "we": we_slow, "launcher": l_slow},
                {"interval": 0.1, "we": we_fast, "launcher": l_fast},
                {"interval": "per heartbeat", "we": per_beat_node, "launcher": per_beat_launcher},
            ],
        )
    )
    report.notes.append(
        "per-heartbeat rows: (0.1 s minus 1 s) / 9 extra heartbeats per second; launcher column in ms of CPU "
        "per heartbeat received"
    )
    if a["problems"]:
        report.notes.append(f"verdicts during part A: {a['problems'][:3]}")
    report.data = {"part_a": a, "ssh_clients": base, "part_b": b}
    frac = a["launcher_cpu_pct"] / 100
    ok = frac < 0.25 and a["launcher_max_rss_mb"] < 300 and not a["problems"]
    report.set_ratio(
        f"launcher CPU, fraction of one core, {args.hosts} hosts at 1 Hz",
        frac,
        f"< 0.25 (and RSS < 300 MB: {a['launcher_max_rss_mb']:.0f} MB)",
        ok,
    )
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
