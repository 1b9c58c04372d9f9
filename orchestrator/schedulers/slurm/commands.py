"""Slurm's commands, run without a shell, bounded in time and output; what they print is validated.

``sbatch``/``scancel``/``scontrol requeue`` act; ``squeue`` → ``scontrol show job`` → ``sacct`` tell a
job's state (squeue knows queued and running jobs, scontrol also those that ended in the last
MinJobAge seconds, sacct everything where accounting is on). Output from Slurm is parsed with
anchored patterns and length limits: garbage gives "unknown", never an exception.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TIMEOUT_S = 30.0
MAX_OUTPUT = 4 << 20
JOB_ID_RE = re.compile(r"^(\d{1,12})(?:_\d{1,9})?(?:;[A-Za-z0-9_.-]{1,64})?$")
STATE_RE = re.compile(r"^[A-Z_]{2,32}$")
FIELD_RE = re.compile(r"^[^\x00-\x1f]{0,512}$")
#: States in which the job still holds or waits for an allocation (our supervisor may run or will).
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)


class SlurmError(OSError):
    """A Slurm command is missing, timed out, or refused; the message is Slurm's own."""


def have(command: str) -> bool:
    return shutil.which(command) is not None


def run(argv: Sequence[str], *, timeout: float = TIMEOUT_S, env: Mapping[str, str] | None = None) -> str:
    """stdout of a Slurm command; SlurmError (with its stderr) when it fails."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise SlurmError(f"{argv[0]}: not found (is this a Slurm login or compute node?)")
    try:
        proc = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g}s (slurmctld down or overloaded?)") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror or exc}") from None
    err = proc.stderr[-4096:].decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        raise SlurmError(f"{argv[0]} failed (exit {proc.returncode}): {err or 'no message'}")
    if len(proc.stdout) > MAX_OUTPUT:
        raise SlurmError(f"{argv[0]} printed more than {MAX_OUTPUT} bytes")
    return proc.stdout.decode("utf-8", "replace")


def parse_job_id(text: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``."""
    line = text.strip().splitlines()[-1].strip() if text.strip() else ""
    m = JOB_ID_RE.match(line)
    if m is None:
        raise SlurmError(f"sbatch printed {line[:80]!r}, not a job id")
    return m.group(1)


def submit(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run ``sbatch --parsable ...``; the job id."""
    return parse_job_id(run(argv, env=env, timeout=60.0))


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about a job (fields validated; "" when unknown)."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, ... or UNKNOWN
    reason: str = ""
    nodes: str = ""
    time_left: str = ""
    elapsed: str = ""
    restarts: int = 0
    exit_code: str = ""
    source: str = ""  # squeue | scontrol | sacct | ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def known(self) -> bool:
        return self.state != "UNKNOWN"

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", None)}


def _clean(value: str) -> str:
    value = value.strip()
    return value if FIELD_RE.match(value) and value not in ("(null)", "None", "N/A") else ""


def _state(value: str) -> str:
    word = value.strip().split(" ")[0].split("+")[0]  # "CANCELLED by 0", "RUNNING+..."
    return word if STATE_RE.match(word) else "UNKNOWN"


def parse_squeue(job_id: str, text: str) -> JobInfo | None:
    """``squeue -h -j ID -o %T|%r|%N|%L|%M`` (one line)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            return JobInfo(
                job_id,
                _state(parts[0]),
                _clean(parts[1]),
                _clean(parts[2]),
                _clean(parts[3]),
                _clean(parts[4]),
                source="squeue",
            )
    return None


def parse_scontrol_job(job_id: str, text: str) -> JobInfo | None:
    """``scontrol show job -o ID``: KEY=VALUE words on one line."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key.isalnum() and key not in fields:
            fields[key] = value
    if "JobState" not in fields:
        return None
    restarts = fields.get("Restarts", "0")
    return JobInfo(
        job_id,
        _state(fields["JobState"]),
        _clean(fields.get("Reason", "")),
        _clean(fields.get("NodeList", "")),
        elapsed=_clean(fields.get("RunTime", "")),
        restarts=int(restarts) if restarts.isdigit() and len(restarts) < 6 else 0,
        exit_code=_clean(fields.get("ExitCode", "")),
        source="scontrol",
    )


def parse_sacct(job_id: str, text: str) -> JobInfo | None:
    """``sacct -n -X -P -j ID -o State,ExitCode,Elapsed,NodeList`` (the allocation's line)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            return JobInfo(
                job_id,
                _state(parts[0]),
                nodes=_clean(parts[3]),
                elapsed=_clean(parts[2]),
                exit_code=_clean(parts[1]),
                source="sacct",
            )
    return None


def job_info(job_id: str, env: Mapping[str, str] | None = None) -> JobInfo:
    """The job's state from the first source that knows it; state UNKNOWN when none does."""
    if not JOB_ID_RE.match(job_id):
        return JobInfo(job_id, "UNKNOWN")
    queries = [
        (["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N|%L|%M"], parse_squeue),
        (["scontrol", "show", "job", "-o", job_id], parse_scontrol_job),
        (["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,Elapsed,NodeList"], parse_sacct),
    ]
    for argv, parse in queries:
        if not have(argv[0]):
            continue
        try:
            info = parse(job_id, run(argv, env=env, timeout=15.0))
        except SlurmError:
            continue
        if info is not None and info.known:
            return info
    return JobInfo(job_id, "UNKNOWN")


@dataclass(frozen=True)
class JobIdentity:
    """Who a queued or running job is: its name, comment and owner (what ``stop`` checks before scancel)."""

    job_id: str
    name: str
    comment: str
    uid: int | None


def parse_identity(job_id: str, text: str) -> JobIdentity | None:
    """``squeue -h -j ID -o %j|%k|%U`` (name|comment|uid), or ``scontrol show job -o ID``."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    if "JobName=" in line:  # scontrol: KEY=VALUE words
        fields = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
        uid = re.search(r"\((\d{1,10})\)$", fields.get("UserId", ""))
        return JobIdentity(
            job_id,
            _clean(fields.get("JobName", "")),
            _clean(fields.get("Comment", "")),
            int(uid.group(1)) if uid else None,
        )
    parts = line.strip().split("|")
    if len(parts) < 3 or not parts[-1].isdigit() or len(parts[-1]) > 10:
        return None
    return JobIdentity(job_id, _clean(parts[0]), _clean("|".join(parts[1:-1])), int(parts[-1]))


def job_identity(job_id: str) -> JobIdentity | None:
    """The job's name, comment and owner while Slurm knows it (squeue, else scontrol); None otherwise."""
    if not JOB_ID_RE.match(job_id):
        return None
    for argv in (["squeue", "-h", "-j", job_id, "-o", "%j|%k|%U"], ["scontrol", "show", "job", "-o", job_id]):
        if not have(argv[0]):
            continue
        try:
            ident = parse_identity(job_id, run(argv, timeout=15.0))
        except SlurmError:
            continue
        if ident is not None:
            return ident
    return None


def cancel(target: str, *, signal: str | None = None, batch_only: bool = False) -> None:
    """scancel a job or a step (``JOB.STEP``); ``batch_only`` signals only the batch shell (our supervisor)."""
    argv = ["scancel"]
    if batch_only:
        argv.append("--batch")
    if signal:
        argv.append(f"--signal={signal}")
    run([*argv, target], timeout=30.0)


def requeue(job_id: str) -> None:
    """``scontrol requeue``: the job ends now and waits in the queue for its next allocation."""
    run(["scontrol", "requeue", job_id], timeout=30.0)


def steps_named(job_id: str, name: str) -> list[str]:
    """Step ids (``JOB.STEP``) of a job's steps called ``name`` (our srun's --job-name)."""
    out = run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], timeout=15.0)
    found = []
    for line in out.splitlines():
        step, _, step_name = line.partition("|")
        if step_name.strip() == name and re.match(r"^\d{1,12}\.\d{1,9}$", step.strip()):
            found.append(step.strip())
    return found


def node_addrs(nodelist: str) -> str:
    """``NAME=ADDR,...`` for the nodes of ``nodelist`` (one ``scontrol show node`` for the whole step)."""
    from worker_entry.agent.modes.slurm import parse_node_addrs

    addrs = parse_node_addrs(run(["scontrol", "show", "node", "-o", nodelist], timeout=20.0))
    return ",".join(f"{k}={v}" for k, v in addrs.items())


def wait_gone(job_id: str, timeout: float, env: Mapping[str, str] | None = None) -> JobInfo:
    """Poll until the job no longer holds or waits for an allocation (or the time is up)."""
    deadline = time.monotonic() + timeout
    info = job_info(job_id, env)
    while info.active and time.monotonic() < deadline:
        time.sleep(0.5)
        info = job_info(job_id, env)
    return info


def job_id_of(env: Mapping[str, str] = os.environ) -> str:
    """The allocation's job id from its environment (SLURM_JOBID: older Slurm's spelling); '' outside one."""
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""


def inside_allocation(env: Mapping[str, str] = os.environ) -> bool:
    """In salloc, an sbatch script or an srun: Slurm set the job id."""
    return bool(job_id_of(env))


def parse_duration(text: str) -> float | None:
    """squeue's %L / %M: ``SS``, ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``; None for UNLIMITED/INVALID/garbage."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if (
        not rest
        or len(parts) > 3
        or not all(p.isdigit() and len(p) <= 6 for p in parts)
        or (days and not days.isdigit())
    ):
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return secs + (int(days) * 86400 if days else 0)
