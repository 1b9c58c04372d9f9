"""Pytest fixtures for a real Slurm on this machine (``tfcluster_testbed.slurm.LocalSlurm``).

``local_slurm`` (session scope): munged, slurmctld and slurmd n1..n3 under a scratch directory, with
their own ports and cluster name; skipped with the reason when the packages (or root) are missing.
Every test that uses it gets a clean queue and must leave no job process behind (``slurm`` fixture:
function scope, checks and cancels after each test). At the end of the session the daemons are
stopped by PID and the directory removed; the teardown fails if it had to kill anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import jsonl

from tfcluster_testbed import slurm as ls
from tfcluster_testbed.waiting import WaitTimeout, wait_for

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[ls.LocalSlurm]:
    ok, why = ls.available()
    if not ok:
        pytest.skip(why)
    cluster = ls.LocalSlurm().start()
    try:
        yield cluster
    finally:
        killed = cluster.stop()
    assert not killed, f"the local Slurm had to kill leftovers at teardown: {killed}"


@pytest.fixture
def slurm(local_slurm: ls.LocalSlurm) -> Iterator[ls.LocalSlurm]:
    """The session's Slurm, checked empty after the test (no job, no task process left)."""
    yield local_slurm
    left: dict[str, Any] = {}

    def empty() -> bool:
        left["jobs"], left["procs"] = _job_states(local_slurm), local_slurm.processes(stepd=True)
        return not left["jobs"] and not left["procs"]

    def completing_ended() -> bool:
        left["jobs"] = _job_states(local_slurm)
        return not left["jobs"] or not all(st == "CG" for st in left["jobs"].values())

    # what is left is asserted below, after the cleanup: a wait that runs out is not the failure itself
    with contextlib.suppress(WaitTimeout):  # a job that just ended is COMPLETING for a moment
        wait_for(empty, 15, "the queue and the jobs' processes to empty", interval=0.2)
    # A job whose node was killed and brought back stays COMPLETING (CG) until that node's new slurmd
    # has told slurmctld the old step is gone: Slurm's bookkeeping, not an allocation the launcher held
    # on to (a job still running, R, is not waited for).
    with contextlib.suppress(WaitTimeout):
        wait_for(completing_ended, 60, "the COMPLETING jobs to leave the queue", interval=0.5)
    left_jobs, procs = left["jobs"], left["procs"]
    leftover = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in procs if _alive(p)]
    try:
        local_slurm.cancel_all()
    finally:
        for p in procs:
            try:
                p.kill()
            except Exception:
                pass
    assert not left_jobs, f"jobs left in the queue: {left_jobs}"
    assert not leftover, f"processes of Slurm jobs left: {leftover}"


def _job_states(cluster: ls.LocalSlurm) -> dict[str, str]:
    """{job id: squeue's compact state} of every job in the queue."""
    out = cluster.run(["squeue", "-h", "-o", "%i %t"], check=False).stdout
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


def _alive(p: Any) -> bool:
    try:
        return p.status() != "zombie"
    except Exception:
        return False


def env_for(cluster: ls.LocalSlurm, **extra: str) -> dict[str, str]:
    """The login node's environment: this cluster, this checkout, no colours."""
    env = cluster.env()
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["NO_COLOR"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def write_spec(path: Path, name: str, command: list[str], slurm: dict[str, Any] | None = None, **sections: Any) -> Path:
    doc: dict[str, Any] = {
        "version": 1,
        "name": name,
        "scheduler": "slurm",
        "slurm": {"nodes": 3, **(slurm or {})},
        "job": {"command": command, "startup_timeout_s": 90, "remote_dir": str(path.parent / "remote")},
        "heartbeat": {"profile_interval_s": 0},
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start(cluster: ls.LocalSlurm, argv: list[str], cwd: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        argv, env=env_for(cluster, **extra), cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def launch_argv(spec: Path, run_dir: Path, *extra: str) -> list[str]:
    return [PY, "-m", "orchestrator", "launch", str(spec), "--run-dir", str(run_dir), *extra]


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(
            f"launcher did not finish within {timeout}s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        ) from None
    return proc.returncode, out, err


def events(run_dir: Path) -> list[dict[str, Any]]:
    return jsonl(run_dir / "events.jsonl")


def result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


def cli(cluster: ls.LocalSlurm, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "orchestrator", *args],
        env=env_for(cluster),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tasks_saying(out: str, text: str) -> list[str]:
    """The tasks of every console line that is ``text`` after its prefix, one entry per task shown: a line
    of its own (``[worker:1 n2] text``) or collapsed with others' (``[worker:0-2] text``,
    ``[chief:0 worker:0,2] text``: the login-node follower shows what several tasks printed alike once)."""
    said: list[str] = []
    for m in re.finditer(rf"^\[([^\]]*)\] {re.escape(text)}$", out, flags=re.M):
        for token in m[1].split():
            role, _, indices = token.partition(":")
            for part in indices.split(",") if indices else ():
                a, _, b = part.partition("-")
                said += [f"{role}:{i}" for i in range(int(a), int(b or a) + 1)]
    return sorted(said)


def run_log(run_dir: Path) -> str:
    """The run's combined.log so far ("" before the launcher created it)."""
    try:
        return (run_dir / "combined.log").read_text()
    except OSError:
        return ""


def run_status(cluster: ls.LocalSlurm, run_dir: Path) -> dict[str, Any]:
    """`tfcluster status RUN --json`, or {} while it has nothing to say."""
    done = cli(cluster, REPO, "status", str(run_dir), "--json")
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
