#!/usr/bin/env python3
"""Where a launch's start goes at 1,024 and 4,096 tasks: the phases from the launcher's fork to every task running.

    python bench/start_phases.py [--sizes 1024,4096] [--before PATH] [--rounds 1] [--json]

The launcher is ``tests/loadfleet.py`` (what ``bench/supervisor_scale.py`` measures: a real ``Job`` and
``Supervisor`` over connect-back TCP, the nodes one ``tfcluster_testbed.loadgen`` process), stopped with
SIGTERM as soon as every task runs. Per size, from the launcher's fork (events.jsonl's own stamps):

* **job started**: the interpreter, the spec and the plan of N hosts, the run directory;
* **attempt started**: plan.json, the sinks, the connect-back server;
* **first / all hello**: every node dialed, proved the secret, got its NodeConfig and said hello
  (``task_ready``); the generator's own figure is its ``dialed`` event (the N handshakes, its clock);
* **go**: the checks over every node's facts passed (``preflight``), the go sent to every task;
* **all running**: the last ``task_spawned`` the launcher read (what supervisor_scale.py calls to running).

And the CPU seconds the launcher and the generator had used by then (``/proc``), and the load average.
``--before PATH``: the same sizes with another checkout's launcher and generator (e.g. a ``git worktree``
of main), alternated with this one's in each round: the before/after of one run on one box.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, Report, WaitTimeout, base_parser, say, set_verbose, wait_for
from supervisor_scale import EventTail, cpu_s, why_failed

PHASES = (
    ("job_started", "job started"),
    ("attempt_started", "attempt started"),
    ("ready_first", "first hello"),
    ("ready_all", "all hello"),
    ("go", "go (preflight)"),
    ("running_all", "all running"),
)


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def one_start(
    repo: Path, n: int, work: Path, timeout: float, hb_timeout: float = 10.0, keep: Path | None = None
) -> dict:
    """One launcher of ``repo`` at ``n`` tasks until every task runs: its phases, CPU and the load."""
    d = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=work))
    run_dir, gen_file = d / "run", d / "gen.jsonl"
    argv = [PY, str(repo / "tests" / "loadfleet.py"), "--tasks", str(n), "--run-dir", str(run_dir)]
    argv += ["--gen-events", str(gen_file), "--interval", "1", "--timeout", str(hb_timeout), "--profile-s", "5"]
    argv += ["--log-rate", "0.1"]
    load0 = os.getloadavg()[0]
    fork = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(d / "launcher.err", "wb"), cwd=str(repo))  # noqa: SIM115
    tail = EventTail(run_dir / "events.jsonl")
    gen_pid: list[int] = []
    loads = [load0]
    row: dict = {"tasks": n}

    def all_running() -> bool:
        loads.append(os.getloadavg()[0])
        if not gen_pid:
            gen_pid.extend(_children(proc.pid)[:1])
        return tail.count("task_spawned") >= n or proc.poll() is not None

    try:
        wait_for(all_running, timeout, f"{n} tasks running (or the launcher's exit)", interval=0.25)
        row["launcher_cpu_s"] = cpu_s(proc.pid)
        row["gen_cpu_s"] = cpu_s(gen_pid[0]) if gen_pid else None
        evs = tail.poll()
        stamps = {k: sorted(e["ts"] for e in evs if e.get("event") == k) for k in ("task_ready", "task_spawned")}
        first = {e.get("event"): e["ts"] for e in reversed(evs)}
        if len(stamps["task_spawned"]) < n:  # the launcher ended first: why, before its directory goes
            proc.wait(120)  # result.json is written as it ends
            raise RuntimeError(f"{n} tasks: only {len(stamps['task_spawned'])} running; {why_failed(d, keep)}")
        row.update(
            job_started=first.get("job_started"),
            attempt_started=first.get("attempt_started"),
            ready_first=stamps["task_ready"][0] if stamps["task_ready"] else None,
            ready_all=stamps["task_ready"][-1] if stamps["task_ready"] else None,
            go=first.get("preflight"),
            running_all=stamps["task_spawned"][-1],
        )
        for key, _ in PHASES:
            row[key] = round(row[key] - fork, 2) if row.get(key) is not None else None
        with contextlib.suppress(OSError, ValueError, StopIteration):
            lines = gen_file.read_text().splitlines()
            row["gen_dial_s"] = next(json.loads(x) for x in lines if '"dialed"' in x).get("seconds")
        row["load"] = f"{load0:.1f}-{max(loads):.1f}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the launcher tears the job down and ends its generator
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in gen_pid:  # a generator the launcher did not end (it was killed): ended by its PID
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return row


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--before", help="another checkout whose launcher is measured alternately (the code before)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--keep",
        help="a directory where a failed start's run directory is copied (default: a new tfc-failed-* in /tmp)",
    )
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds one start may take before it fails")
    ap.add_argument(
        "--hb-timeout", type=float, default=10.0, help="the spec's heartbeat timeout (supervisor_scale.py's)"
    )
    args = ap.parse_args()
    set_verbose(args.verbose)
    sizes = [256] if args.quick else [int(x) for x in args.sizes.split(",")]
    repos = [("after", REPO)] + ([("before", Path(args.before).resolve())] if args.before else [])
    rows = []
    keep = Path(args.keep) if args.keep else None
    with tempfile.TemporaryDirectory(prefix="tfc-start-") as tmp:
        for rnd in range(args.rounds):
            for n in sizes:
                order = repos if rnd % 2 == 0 else repos[::-1]
                for name, repo in order:
                    say(f"round {rnd + 1}: {n} tasks, {name} ...")
                    try:
                        row = one_start(repo, n, Path(tmp), args.timeout, args.hb_timeout, keep)
                    except (OSError, RuntimeError, WaitTimeout) as exc:
                        say(f"{n} tasks, {name}: {exc}")
                        row = {"tasks": n, "load": f"error: {exc!r}"[:80]}
                    rows.append({"code": name, "round": rnd + 1, **row})
    columns = [("code", "code"), ("round", "round"), ("tasks", "tasks")]
    columns += [(k, f"{h} s") for k, h in PHASES]
    columns += [("gen_dial_s", "gen dial s"), ("launcher_cpu_s", "launcher CPU s"), ("gen_cpu_s", "gen CPU s")]
    columns += [("load", "load")]
    report = Report("a launch's start, phase by phase (s from the launcher's fork)", columns, rows)
    big = [r for r in rows if r["code"] == "after" and r["tasks"] == 4096 and r.get("running_all") is not None]
    best = min((r["running_all"] for r in big), default=None)
    report.set_ratio("to running at 4,096 tasks, s (best round)", best, "<= 10", best is not None and best <= 10)
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
