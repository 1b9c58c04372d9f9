"""The run directory: everything a run leaves on the launcher, in one place, private to its user.

RUN/
  spec.yaml  plan.json  launcher.json  status.json  events.jsonl  heartbeats.jsonl
  combined.log            every task's lines, prefixed with time, task and host
  logs/<type>-<index>.log raw lines of a task (attempt 0); logs/<type>-<index>.attempt-N.log after restarts
  logs/cuts.json          tasks whose output passed logs.max_bytes_per_task (cut from that attempt on)
  result.json             written once, at the end (``sinks.record``)
  summary.json            the whole-run report after the end, read by ``report`` while it matches (``views.runsummary``)
  .reserve                space held for result.json and status.json on a full disk (``runs.reserve``), until the end
  tensorboard/            TensorBoard scalars per task and for the job (``sinks.tensorboard``; or the user's dir)
  checkpoints/            the chief's checkpoint directory, gathered and verified
  backup/copy-N/          the chief's BackupAndRestore backup, copied off its host after each save (local disks)
  nodes/                  node-side task directories (exit.json, complete logs) copied back
  gather-state.json       what the gather has verified (a resumed gather skips it)
  slurm.json  slurm/      Slurm: the run across allocations; batch script, sbatch/srun output, stop request,
                          the private spec (0600) the batch job's supervisor runs, removed at the end
  kubernetes.json         Kubernetes: the objects applied and every pod's phase, node and exit

Every path of a run is a property here; nothing else spells a file name of the run directory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..core import fastjson
from ..core.errors import RunNotFound, UsageError
from ..plan.record import PlanRecord, PlanRecordError
from .jsonl import objects
from .reserve import NAME as RESERVE
from .reserve import make_reserve, with_reserve

SLURM_DIR = "slurm"  # RUN/slurm/: the Slurm batch script, sbatch's argv and answer, srun's and the job's output


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def spec_yaml(self) -> Path:
        return self.path / "spec.yaml"

    @property
    def plan_json(self) -> Path:
        return self.path / "plan.json"

    @property
    def launcher_json(self) -> Path:
        return self.path / "launcher.json"

    @property
    def tensorboard_dir(self) -> Path:
        """TensorBoard event files of what tfcluster measured (one run per task, and ``job``)."""
        return self.path / "tensorboard"

    @property
    def launcher_log(self) -> Path:
        """What the launcher printed, once it runs without a terminal (--detach, or after SIGHUP)."""
        return self.path / "launcher.log"

    @property
    def status_json(self) -> Path:
        return self.path / "status.json"

    @property
    def events_jsonl(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def heartbeats_jsonl(self) -> Path:
        return self.path / "heartbeats.jsonl"

    @property
    def combined_log(self) -> Path:
        return self.path / "combined.log"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def result_json(self) -> Path:
        return self.path / "result.json"

    @property
    def summary_json(self) -> Path:
        """The whole-run report, written at the run's end for ``report`` (``views.runsummary``)."""
        return self.path / "summary.json"

    def report_sources(self) -> dict[str, dict[str, Any] | None]:
        """Bytes and SHA-256 of each file a report is built from (None: absent): what summary.json names."""
        out: dict[str, dict[str, Any] | None] = {}
        for p in (self.heartbeats_jsonl, self.events_jsonl, self.plan_json, self.result_json):
            h, size = hashlib.sha256(), 0
            try:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 20):  # hashlib.file_digest is 3.11's
                        h.update(chunk)
                        size += len(chunk)
            except FileNotFoundError:
                out[p.name] = None
                continue
            out[p.name] = {"bytes": size, "sha256": h.hexdigest()}
        return out

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def backup_copies(self) -> Path:
        """Complete copies of the chief's backup (``transfer.backupcopy.CopyStore``): they outlive its host."""
        return self.path / "backup"

    @property
    def gather_dir(self) -> Path:
        """Node-side task directories (complete logs, exit status) copied back after the job."""
        return self.path / "nodes"

    @property
    def gather_state_json(self) -> Path:
        return self.path / "gather-state.json"

    @property
    def slurm_json(self) -> Path:
        """Slurm: job ids, allocations, requeue counters and ended allocations' attempts."""
        return self.path / "slurm.json"

    @property
    def slurm_dir(self) -> Path:
        """Slurm: the batch script (job.sh), sbatch's argv and answer, srun's and the job's output."""
        return self.path / SLURM_DIR

    @property
    def slurm_stop_json(self) -> Path:
        """Slurm: a user's stop request, left before Slurm's SIGTERM so it is not taken for a preemption."""
        return self.slurm_dir / "stop.json"

    @property
    def slurm_private_spec(self) -> Path:
        """Slurm: the spec as written (credentials included) for the batch job's supervisor; 0600, only
        while the run goes on — kept out of the job's environment, which Slurm stores."""
        return self.slurm_dir / "private-spec.json"

    @property
    def kubernetes_json(self) -> Path:
        """Kubernetes: the objects applied and every pod's phase, node and exit."""
        return self.path / "kubernetes.json"

    @property
    def reserve(self) -> Path:
        """Space held for result.json and status.json on a full disk (``runs.reserve``), until the run's end."""
        return self.path / RESERVE

    @property
    def log_cuts(self) -> Path:
        """Tasks whose output passed logs.max_bytes_per_task: task -> the attempt it was cut in."""
        return self.logs_dir / "cuts.json"

    def cut_from(self, task: str) -> int | None:
        """The attempt from which ``task``'s log was cut (its later logs too), or None."""
        cuts = self.read_json(self.log_cuts)
        attempt = cuts.get(task) if isinstance(cuts, dict) else None
        return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0 else None

    def task_log(self, slug: str, attempt: int = 0) -> Path:
        name = f"{slug}.log" if attempt == 0 else f"{slug}.attempt-{attempt}.log"
        return self.logs_dir / name

    @classmethod
    def create(cls, path: str | Path, adopt: bool = False) -> RunDir:
        """Make the directory private (0700): logs and env may hold secrets; only its owner may stop the job.
        ``adopt``: it may already exist holding only launcher.log (made for a --detach launcher)."""
        p = Path(path)
        existing = check_new_dir(p)
        allowed = {"launcher.log", "logs", RESERVE} if adopt else set()
        if any(name not in allowed for name in existing):
            raise UsageError(f"run directory {p} already exists and is not empty; choose another --run-dir")
        try:
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(p, 0o700)
            (p / "logs").mkdir(exist_ok=True, mode=0o700)
        except OSError as exc:
            raise UsageError(f"cannot create run directory {p}: {exc.strerror}") from None
        make_reserve(p)  # space for result.json and status.json, whatever fills the disk later
        return cls(p)

    def read_json(self, path: Path) -> Any:
        try:
            with open_regular(path) as f:
                data = f.read(MAX_JSON + 1)
            return json.loads(data) if len(data) <= MAX_JSON else None
        except (OSError, ValueError, RecursionError):
            return None

    def is_finished(self) -> bool:
        return self.result_json.exists()


def check_new_dir(path: Path, option: str = "--run-dir") -> list[str]:
    """The names in ``path`` if it is a directory (none if it does not exist yet); a UsageError naming
    ``option`` if it is something else or cannot be listed — before a launch plans or connects."""
    try:
        if not path.exists():
            above = next((a for a in path.parents if a.exists()), None)
            if above is not None and not above.is_dir():
                raise UsageError(f"{option} {path}: {above} is not a directory; name a new or empty directory")
            return []
        if not path.is_dir():
            raise UsageError(f"{option} {path}: exists and is not a directory; name a new or empty directory")
        return [c.name for c in path.iterdir()]
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot use it: {exc.strerror or exc}") from None


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = 2, durable: bool = True) -> None:
    """Readers (status, logs --follow) never see half a file: write a temp file, rename.

    ``durable`` fsyncs before the rename (results); live files rewritten every second
    (status.json) skip it: the rename alone keeps readers safe, and an fsync a second is disk load.
    """
    if indent is None:  # compact: status.json, every task, every second (``core.fastjson``: orjson if there)
        write_bytes_atomic(path, fastjson.dumps(obj) + b"\n", durable=durable)
        return
    write_bytes_atomic(path, (json.dumps(obj, indent=indent, default=str) + "\n").encode(), durable=durable)


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """A file only its owner may read (spec copies, scripts), whatever the umask; no symlink followed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def write_bytes_atomic(path: Path, data: bytes | Iterable[bytes], *, durable: bool = True) -> None:
    """``path`` holds ``data`` (bytes, or chunks streamed from a large file) whole, or is left as it
    was: a temp file in the same directory, renamed over it. Private (0600) like the run directory.
    The one atomic writer of the launcher: JSON records, pages, PNGs, a log completed from its node.
    A record (bytes) that finds the disk full uses the run directory's reserve (``runs.reserve``)."""
    if isinstance(data, bytes | bytearray):
        with_reserve(path, len(data), lambda: _write_atomic(path, data, durable))
    else:
        _write_atomic(path, data, durable)


def _write_atomic(path: Path, data: bytes | Iterable[bytes], durable: bool) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in [data] if isinstance(data, bytes | bytearray) else data:
                f.write(chunk)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def resolve_run(arg: str, runs_dir: str | Path = "runs") -> RunDir:
    """A run directory path, or a job name meaning its newest run under `runs_dir` that this user can
    read — this user's own runs first: in a shared `runs/` another user may plant a run of any name
    (``foreign_owner`` says whose a run is, for the caller to tell). Another user's private (0700)
    run is passed over (and named in the message if nothing else matches), never an error for everyone."""
    p = Path(arg)
    try:
        if p.is_dir():
            _readable_run(p, arg)
            if not (p / "plan.json").is_file():
                raise RunNotFound(f"{arg} is a directory but not a tfcluster run (no plan.json)")
            return RunDir(p)
    except OSError as exc:
        raise UsageError(f"{arg}: cannot read it: {exc.strerror or exc}") from None
    base = Path(runs_dir)
    candidates, private = [], []
    try:
        entries = list(base.iterdir()) if base.is_dir() else []
    except OSError as exc:
        raise UsageError(f"{base}/: cannot list it: {exc.strerror or exc}; pass the run directory path") from None
    for d in entries:
        plan = d / "plan.json"
        named = d.name.startswith(f"{arg}-")
        try:
            if not plan.is_file():
                continue
            job, purpose = _job_of(plan)
            if named or job == arg:
                mine = d.stat().st_uid == os.getuid()
                # a job's name means its latest training run: a check run after it does not shadow it
                candidates.append((mine, purpose != "check", plan.stat().st_mtime, d.name, d))
        except PermissionError:
            if named:
                private.append(d)
        except OSError:
            continue
    if not candidates:
        if private:
            owners = ", ".join(sorted({_owner(d) for d in private}))
            raise RunNotFound(
                f"no run of {arg!r} that you can read under {base}/: {len(private)} belong to other users "
                f"({owners}) and are private to them (0700)"
            )
        raise RunNotFound(f"no run directory or job named {arg!r} (looked in {base}/); pass the run directory path")
    candidates.sort()
    return RunDir(candidates[-1][-1])


def foreign_owner(run: RunDir) -> str | None:
    """``user (uid N)`` when ``run`` is not the caller's own run directory (None: it is)."""
    try:
        if run.path.stat().st_uid == os.getuid():
            return None
    except OSError:
        return None
    return _owner(run.path)


def _readable_run(path: Path, arg: str) -> None:
    """A UsageError naming the owner if ``path`` is another user's private run directory."""
    try:
        os.stat(path / "plan.json")
    except PermissionError:
        raise UsageError(
            f"{arg}: this run directory belongs to {_owner(path)} and is private to its owner (0700); "
            "status, logs and stop work only for the user who started the run"
        ) from None
    except OSError:
        pass


def _owner(path: Path) -> str:
    """``user (uid N)`` of a path, or ``uid N`` when the name is unknown."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "another user"
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def wait_for_run(arg: str, runs_dir: str | Path = "runs", timeout_s: float = 120.0) -> RunDir:
    """Like resolve_run, but a run directory *path* that does not exist yet is waited for
    (`logs --follow runs/x` started just before `launch --run-dir runs/x`)."""
    import time

    looks_like_path = "/" in arg or arg.startswith(".")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return resolve_run(arg, runs_dir)
        except RunNotFound:
            if not looks_like_path or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _job_of(plan: Path) -> tuple[str | None, str | None]:
    """(the job, the run's purpose: ``train`` or ``check``) of a plan.json, read through the typed record
    (``PlanRecord.purpose`` decides what a check run is); (None, None) when it is not one."""
    try:
        with open_regular(plan) as f:
            data = json.loads(f.read(MAX_JSON))
        record = PlanRecord.from_dict(data, str(plan))
    except PlanRecordError:  # a damaged record: its job name still counts, as before
        job = data.get("job") if isinstance(data, dict) else None
        return (job if isinstance(job, str) else None), None
    except (OSError, ValueError, AttributeError, TypeError, KeyError, IndexError, ArithmeticError, RecursionError):
        return None, None  # (any other damage: one planted run must not break every lookup by name)
    return record.job, record.purpose


#: A run's JSON file larger than this is not one (plan.json of 4,096 tasks is a few MB).
MAX_JSON = 64 << 20


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading only if it is a regular file: never blocking on a FIFO or a device
    planted in a shared runs directory (O_NONBLOCK at the open, then S_ISREG), never through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a .jsonl file; a torn or foreign line (a crash mid-write, or nesting too deep
    for the parser) is skipped. Read a block of lines per decoder call (``jsonl.objects``: the same
    objects, a fifth less CPU on a large file)."""
    try:
        f = open_regular(path)
    except OSError:
        return
    with f:
        yield from objects(f)
