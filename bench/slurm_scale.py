"""bench/supervisor_scale.py --slurm: 258 real worker_entry tasks (3 local slurmd x 86) under one supervisor.

The job (``sleep 30`` on every task, 1 Hz heartbeats) is launched from the login node: sbatch, then the
batch job's supervisor runs one srun step whose tasks connect back. That supervisor (launcher.json's
pid) is measured like the load-generator sizes: to all running, CPU % of a core and RSS over a window
of the run, and its whole-life CPU; the job must succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import yaml
from common import PY, REPO, wait_for
from supervisor_scale import EventTail, cpu_s, measure

NODES, PER_NODE = 3, 86


def slurm_258(work: Path, seconds: float) -> dict:
    from tfcluster_testbed.slurm import LocalSlurm, available

    ok, why = available()
    if not ok:
        return {"tasks": NODES * PER_NODE, "state": f"skipped: {why}"}
    d = work / "slurm"
    d.mkdir()
    spec = {
        "version": 1,
        "name": "slurm258",
        "scheduler": "slurm",
        "slurm": {"nodes": NODES, "tasks_per_node": PER_NODE},
        "job": {"command": ["sleep", "30"], "startup_timeout_s": 300, "remote_dir": str(d / "remote")},
        "heartbeat": {"interval_s": 1, "timeout_s": 30, "profile_interval_s": 0},
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    n = NODES * PER_NODE
    with LocalSlurm(cpus=PER_NODE) as cluster:
        env = cluster.env()
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["NO_COLOR"] = "1"
        fork = time.time()
        client = subprocess.Popen(
            [PY, "-m", "orchestrator", "launch", str(d / "spec.yaml"), "--run-dir", str(d / "run"), "-q"],
            env=env,
            cwd=str(d),
            stdout=subprocess.DEVNULL,
            stderr=open(d / "client.err", "wb"),  # noqa: SIM115
        )
        row: dict = {"tasks": n}
        try:
            launcher = d / "run" / "launcher.json"
            wait_for(lambda: launcher.exists() or client.poll() is not None, 120, "launcher.json", interval=0.2)
            pid = json.loads(launcher.read_text())["pid"]
            born = time.time()
            tail = EventTail(d / "run" / "events.jsonl")
            wait_for(
                lambda: tail.count("task_spawned") >= n or client.poll() is not None,
                300,
                f"{n} task_spawned events (or the client's exit)",
                interval=0.5,
            )
            deadline = time.monotonic() + 300
            spawned = [e["ts"] for e in tail.poll() if e.get("event") == "task_spawned"]
            row["to_running_s"] = round(max(spawned) - fork, 2) if len(spawned) == n else None
            row["cpu_pct"], row["rss_mb"] = (round(x, 1) for x in measure(pid, min(seconds, 20.0)))
            last = cpu_s(pid)
            while client.poll() is None and time.monotonic() < deadline + 120:
                last = cpu_s(pid) or last
                time.sleep(0.2)
            row["whole_life_cpu_pct"] = round(100.0 * (last or 0.0) / max(1e-9, time.time() - born), 1)
            row["launcher_wall_s"] = round(time.time() - fork, 1)
            with contextlib.suppress(OSError, ValueError):
                row["state"] = json.loads((d / "run" / "result.json").read_text())["state"]
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    return row
