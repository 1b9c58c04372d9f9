#!/usr/bin/env python3
"""tfcluster under Slurm, side by side with a plain srun of the same job (needs root, slurm-wlm, munge).

    python bench/slurm.py [--quick] [--json] [--repeat N]

A real Slurm on this machine (tfcluster_testbed.slurm.LocalSlurm: slurmctld + slurmd n1..n3, all
state under a scratch directory, torn down at the end). Two figures, each for four ways to run:

* launch → all tasks running: 3 tasks of ``sh -c 'date +%s.%N; exec true'``; from the fork of the
  client until the LAST task printed its timestamp (its command started), so every method is timed by
  the same clock at the same point. Methods: plain ``srun -N3 -n3`` (allocates itself); ``salloc
  -N3 tfcluster launch`` (inside an allocation: one srun step, tasks connect back, hello, checks,
  go); plain ``sbatch --wait`` of a script running the same srun; ``tfcluster launch`` from the login
  node (sbatch of the supervisor, which runs the step; the client follows the run directory).
* SIGKILL → every task gone: a 3-task MWMS job (tests/workloads/mwms_job.py, 1000 epochs); once every
  task is past its first epoch, SIGKILL of worker:1's training process; time until no process of
  the job is left (every process carrying the cluster's SLURM_CONF) and the client has exited. Plain
  srun gets the same TF_CONFIG built by a wrapper (bench/workloads/srun_tf_config.py), with and
  without ``--kill-on-bad-exit``; tfcluster inside an allocation and from the login node.

Ratios printed last: plain srun / tfcluster inside an allocation, for both figures (how close
tfcluster's own supervision comes to Slurm's bare launcher).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, REPO, Report, base_parser, events, median, say, set_verbose, wait_for

from tfcluster_testbed.slurm import LocalSlurm, available

WORKLOAD = REPO / "tests" / "workloads" / "mwms_job.py"
WRAPPER = REPO / "bench" / "workloads" / "srun_tf_config.py"
STAMP = ["sh", "-c", "date +%s.%N; exec true"]
SRUN = ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1"]


def env_for(cluster: LocalSlurm) -> dict[str, str]:
    env = cluster.env()
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["NO_COLOR"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def write_spec(work: Path, name: str, command: list[str]) -> Path:
    import yaml

    spec = {
        "version": 1,
        "name": name,
        "scheduler": "slurm",
        "slurm": {"nodes": 3},
        "job": {"command": command, "remote_dir": str(work / "remote"), "startup_timeout_s": 120},
        "heartbeat": {"interval_s": 0.5, "timeout_s": 5, "profile_interval_s": 0},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def stamps(text: str) -> list[float]:
    """The `date +%s.%N` lines in a text (with or without tfcluster's [task host] prefix)."""
    out = []
    for line in text.splitlines():
        word = line.rsplit(" ", 1)[-1].strip()
        try:
            if word.count(".") == 1 and len(word) > 12:
                out.append(float(word))
        except ValueError:
            continue
    return out


# ------------------------------------------------------------------------------ launch → running


def launch_trial(cluster: LocalSlurm, work: Path, method: str, i: int) -> dict:
    env = env_for(cluster)
    name = f"lr-{method.replace(' ', '-').replace('+', '-')}-{i}"
    run_dir = work / f"{name}-run"
    out_file = work / f"{name}.out"
    if method == "srun":
        argv = [*SRUN, *STAMP]
    elif method == "sbatch+srun":
        script = work / f"{name}.sh"
        script.write_text("#!/bin/sh\nexec " + " ".join([*SRUN, "sh", "-c", "'date +%s.%N; exec true'"]) + "\n")
        argv = ["sbatch", "--wait", "--nodes=3", "--ntasks-per-node=1", f"--output={out_file}", str(script)]
    else:
        spec = write_spec(work, name, STAMP)
        launch = [PY, "-m", "orchestrator", "launch", str(spec), "--run-dir", str(run_dir), "--no-live"]
        argv = ["salloc", "--nodes=3", "--ntasks-per-node=1", *launch] if method == "tfcluster in salloc" else launch
    t_fork = time.time()
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=str(work), capture_output=True, text=True, timeout=180)
    wall = time.monotonic() - t0
    text = proc.stdout + (out_file.read_text() if out_file.exists() else "")
    if (run_dir / "combined.log").exists():
        text = (run_dir / "combined.log").read_text()
    ts = stamps(text)
    if proc.returncode != 0 or len(ts) != 3:
        raise RuntimeError(f"{method}: rc {proc.returncode}, {len(ts)} stamps: {proc.stderr[-1500:]}")
    return {"to_running": max(ts) - t_fork, "wall": wall, "phases": phases(run_dir, t_fork)}


def phases(run_dir: Path, t_fork: float) -> dict[str, float]:
    """Where tfcluster's time to running goes, from its events (seconds since the client's fork)."""
    evs = events(run_dir)
    if not evs:
        return {}

    def at(kind: str, last: bool = False) -> float | None:
        ts = [e["ts"] for e in evs if e["event"] == kind]
        return (max(ts) if last else min(ts)) - t_fork if ts else None

    sub = (
        json.loads((run_dir / "slurm" / "submitted.json").read_text())["ts"] - t_fork
        if (run_dir / "slurm" / "submitted.json").exists()
        else None
    )
    return {
        k: v
        for k, v in {
            "sbatch returned": sub,
            "supervisor up (slurm_allocation)": at("slurm_allocation"),
            "srun started (attempt_started)": at("attempt_started"),
            "first task hello": at("task_ready"),
            "last task hello": at("task_ready", last=True),
            "last task running (spawned)": at("task_spawned", last=True),
        }.items()
        if v is not None
    }


# ------------------------------------------------------------------------------ SIGKILL → gone


def kill_trial(cluster: LocalSlurm, work: Path, method: str, i: int, cap: float) -> dict:
    env = env_for(cluster)
    name = f"kill-{method.replace(' ', '-')}-{i}"
    pid_dir = work / f"{name}-pids"
    pid_dir.mkdir()
    job = [PY, str(WORKLOAD), "--epochs", "1000", "--steps", "50", "--pid-dir", str(pid_dir)]
    log = work / f"{name}.log"
    if method.startswith("srun"):
        kob = ["--kill-on-bad-exit=1"] if "kill-on-bad-exit" in method else ["--kill-on-bad-exit=0"]
        argv = [*SRUN, *kob, PY, str(WRAPPER), *job]
    else:
        run_dir = work / f"{name}-run"
        spec = write_spec(work, name, job)
        launch = [PY, "-m", "orchestrator", "launch", str(spec), "--run-dir", str(run_dir), "-q", "--no-live"]
        argv = ["salloc", "--nodes=3", "--ntasks-per-node=1", *launch] if "salloc" in method else launch
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=str(work), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: _past_first_epoch(log, work / f"{name}-run") or proc.poll() is not None,
            240,
            f"{method}: the workers past their first epoch (log {log})",
            interval=0.2,
        )
        pids = {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}
        if proc.poll() is not None or len(pids) != 3:
            raise RuntimeError(f"{method}: training did not start: {log.read_text()[-1500:]}")
        t0 = time.monotonic()
        os.kill(pids["worker-1"], signal.SIGKILL)
        t_exit = t_gone = None
        while time.monotonic() - t0 < cap:
            if t_exit is None and proc.poll() is not None:
                t_exit = time.monotonic() - t0
            if t_gone is None and not cluster.processes():
                t_gone = time.monotonic() - t0
            if t_exit is not None and t_gone is not None:
                break
            time.sleep(0.02)
        return {"client_exit": t_exit, "gone": max(t_exit or cap, t_gone or cap), "capped": t_gone is None}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        cluster.cancel_all()
        for p in cluster.processes():
            try:
                p.kill()
            except Exception:
                pass


def _past_first_epoch(log: Path, run_dir: Path) -> bool:
    text = log.read_text(errors="replace")
    if (run_dir / "combined.log").exists():
        text += (run_dir / "combined.log").read_text(errors="replace")
    return all(f"worker:{i}: epoch 1 begins" in text for i in range(3))


# ------------------------------------------------------------------------------ main

LAUNCH_METHODS = ["srun", "tfcluster in salloc", "sbatch+srun", "tfcluster from login node"]
KILL_METHODS = ["srun", "srun --kill-on-bad-exit", "tfcluster in salloc", "tfcluster from login node"]


def main() -> int:
    ap = base_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=float, default=60.0, help="give up waiting for the processes after this long")
    args = ap.parse_args()
    set_verbose(args.verbose)
    ok, why = available()
    if not ok:
        print(f"bench/slurm.py: {why}", file=sys.stderr)
        return 2
    repeat = args.repeat or (1 if args.quick else 3)
    report = Report(
        "tfcluster under Slurm vs plain srun (3 tasks on slurmd n1..n3 of this machine)",
        [
            ("method", "method"),
            ("to_running", "launch→running s"),
            ("launch_wall", "client wall s"),
            ("gone", "SIGKILL→all gone s"),
            ("client_exit", "SIGKILL→client exit s"),
        ],
    )
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-slurm-") as tmp, LocalSlurm() as cluster:
        work = Path(tmp)
        say(f"local Slurm {cluster.name} up; {repeat} repetition(s)")
        launch: dict[str, list[dict]] = {m: [] for m in LAUNCH_METHODS}
        kills: dict[str, list[dict]] = {m: [] for m in KILL_METHODS}
        for i in range(repeat):
            order = LAUNCH_METHODS[i % 4 :] + LAUNCH_METHODS[: i % 4]  # rotated: no method always goes first
            for k, m in enumerate(order):
                launch[m].append(launch_trial(cluster, work, m, i * 10 + k))
                say(f"launch {m}: {launch[m][-1]}")
        for i in range(repeat):
            order = KILL_METHODS[i % 4 :] + KILL_METHODS[: i % 4]
            for k, m in enumerate(order):
                kills[m].append(kill_trial(cluster, work, m, i * 10 + k, args.cap))
                say(f"kill {m}: {kills[m][-1]}")
        for m in dict.fromkeys(LAUNCH_METHODS + KILL_METHODS):
            report.rows.append(
                {
                    "method": m,
                    "to_running": median([r["to_running"] for r in launch.get(m, [])]) if launch.get(m) else None,
                    "launch_wall": median([r["wall"] for r in launch.get(m, [])]) if launch.get(m) else None,
                    "gone": median([r["gone"] for r in kills.get(m, [])]) if kills.get(m) else None,
                    "client_exit": median([r["client_exit"] for r in kills.get(m, []) if r["client_exit"] is not None])
                    if kills.get(m)
                    else None,
                }
            )
        report.data = {"launch": launch, "kill": kills}
        for m in ("tfcluster in salloc", "tfcluster from login node"):
            names = list(dict.fromkeys(k for r in launch[m] for k in r["phases"]))
            rows = [{"phase": k, "s": median([r["phases"][k] for r in launch[m] if k in r["phases"]])} for k in names]
            report.extra_tables.append(
                (f"{m}: launch phases (s since the client's fork, median)", [("phase", "phase"), ("s", "s")], rows)
            )
    rows = {r["method"]: r for r in report.rows}
    capped = [m for m, rs in kills.items() if any(r["capped"] for r in rs)]
    report.notes.append(f"median of {repeat}; SIGKILL of worker:1's training process after every task's first epoch")
    if capped:
        report.notes.append(f"capped at {args.cap:g}s (processes still there): {', '.join(capped)}")
    r_launch = rows["srun"]["to_running"] / rows["tfcluster in salloc"]["to_running"]
    r_kill = rows["srun --kill-on-bad-exit"]["gone"] / rows["tfcluster in salloc"]["gone"]
    report.notes.append(f"plain srun --kill-on-bad-exit / tfcluster in salloc, SIGKILL→all gone: {r_kill:.2f}")
    report.data["kill_ratio"] = round(r_kill, 3)
    report.set_ratio("plain srun / tfcluster in salloc, launch→running", r_launch, "informational", None)
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
