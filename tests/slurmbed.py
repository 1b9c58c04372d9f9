"""What the Slurm e2e files share beyond the fixtures (``slurm_fixtures``): reading a task's epochs
from its log, the step each task saw, a free TF port block, a Keras job that prints its step, and
the local Slurm's job and node state as ``squeue``/``sinfo`` show it."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import psutil
from slurm_fixtures import PY

EPOCH_RE = re.compile(r"\] epoch (\d+)/(\d+) ")
STEP_RE = re.compile(r"\] STEP (\d+)\.(\d+) (\S+)")
#: Prefixed to a task's command: each task prints the Slurm job, step and step nodes it runs in.
SHOW_STEP = 'echo "STEP $SLURM_JOB_ID.$SLURM_STEP_ID $SLURM_STEP_NODELIST"; exec "$0" "$@"'


def epochs(run_dir: Path, attempt: int, task: str = "worker-1") -> list[int]:
    """The epochs ``task``'s log of ``attempt`` shows (keras_synthetic's ``epoch N/M`` lines)."""
    name = f"{task}.log" if attempt == 0 else f"{task}.attempt-{attempt}.log"
    try:
        return [int(m.group(1)) for m in EPOCH_RE.finditer((run_dir / "logs" / name).read_text())]
    except OSError:
        return []


def steps_seen(run_dir: Path) -> set[tuple[str, str, str]]:
    """(job, step, step nodelist) of every task that ran ``SHOW_STEP``."""
    return {m.groups() for m in STEP_RE.finditer((run_dir / "combined.log").read_text())}


def keras_backup_job(epochs_: int, steps_per_epoch: int = 30, slow_input_ms: int = 40) -> list[str]:
    """keras_synthetic with a BackupAndRestore backup, showing its step first."""
    tail = ["--epochs", str(epochs_), "--steps-per-epoch", str(steps_per_epoch), "--slow-input-ms", str(slow_input_ms)]
    return ["sh", "-c", SHOW_STEP, PY, "-m", "worker_entry.examples.keras_synthetic", "--backup", *tail]


def free_port_base(n: int) -> int:
    """A port with the next ``n - 1`` free as well (tasks sharing an address count up from it): this
    machine's other local Slurms number their jobs from 1 too, so ports derived from the job and step
    id could collide with theirs."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    raise AssertionError("no block of free ports")


def alive(pid: int) -> bool:
    """Running (a zombie, waiting for its parent to reap it, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def job_state(slurm, job_id: str) -> tuple[str, str]:
    """(state, nodes) as squeue shows them; ("", "") once the job is gone."""
    out = slurm.run(["squeue", "-h", "-j", job_id, "-o", "%T|%N"], check=False).stdout.strip()
    state, _, nodes = out.partition("|")
    return state, nodes


def show_job(slurm, job_id: str) -> str:
    return slurm.run(["scontrol", "show", "job", job_id], check=False).stdout


def sleep_task_on(slurm, node: str) -> int | None:
    """The PID of a ``sleep`` task of this cluster's jobs on ``node`` (under that node's slurmstepd)."""
    for p in slurm.processes():
        try:
            parent = p.parent()
            under_stepd = p.name() == "sleep" and parent is not None and parent.name() == "slurmstepd"
            if under_stepd and any(f.path.endswith(f"slurmd-{node}.log") for f in parent.open_files()):
                return p.pid
        except psutil.Error:
            continue
    return None
