"""`tfcluster status` without a RUN: the recent runs under a runs directory, newest first.

Like ``squeue`` or ``ray job list``: one line per run — job name, state, when it started, wall time,
tasks, root cause, run directory. Each run is read cheaply: its small JSON files (plan.json,
launcher.json, status.json, result.json; never heartbeats.jsonl or the logs), each read only up to
``MAX_JSON_BYTES``. A run without result.json is asked about through its scheduler's handle (the same
one ``status RUN`` uses): alive, waiting in the scheduler's queue, or gone without a result.

A runs directory is shared ground: a directory that is not a run is passed over, a run whose files are
damaged is listed as ``damaged``, and another user's private run (0700) is skipped and counted in a
note — never a traceback. Sweeps (``tfcluster scale``) keep each size's run one level down
(``SWEEP/workers-N``): those are listed too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.text import table
from ..runs import RunDir, read_plan
from ..runs.untrusted import read_json_strict
from .handle import RunHandle

MAX_JSON_BYTES = 16 << 20  # a run's JSON file larger than this is damaged (plan.json of 10,000 tasks: ~10 MB)
MAX_ENTRIES = 100_000  # entries of a runs directory looked at (a directory of a million files is not a runs dir)
DEFAULT_LIMIT = 20


@dataclass(frozen=True)
class RunRow:
    """One run as the list shows it (``to_dict`` is its ``--json`` form)."""

    job: str | None
    state: str
    started: float | None  # seconds since the epoch
    wall_time_s: float | None
    tasks: int | None
    root_cause: str | None
    run_dir: str
    run_id: str | None = None
    scheduler: str | None = None
    purpose: str | None = None  # "check": a run of `tfcluster check` (a job's name never means it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunList:
    """The rows shown, and what was passed over (``notes``) — said, not hidden."""

    runs: list[RunRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    total: int = 0  # runs that matched before --limit
    filtered: bool = False  # by state

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs], "total": self.total, "notes": self.notes}


class _Unreadable(Exception):
    """A run directory (or one of its files) this user may not read."""


def _read(path: Path) -> Any:
    """A run's JSON file: None when absent; ValueError when damaged; _Unreadable when not ours to read."""
    try:
        return read_json_strict(path, MAX_JSON_BYTES)
    except PermissionError as exc:
        raise _Unreadable(str(path)) from exc


def _obj(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) < 1e12 else None


def _text(x: Any, limit: int = 200) -> str | None:
    return x[:limit] if isinstance(x, str) else None


def _root_cause(rc: Any) -> str | None:
    rc = _obj(rc)
    message = _text(rc.get("message"))
    if not message:
        return None
    who = _text(rc.get("task"), 40) or "job"
    return f"{who}: {message.splitlines()[0] if message.splitlines() else message}"


def read_run(run: RunDir, handle_of: Callable[[RunDir], RunHandle], now: float | None = None) -> RunRow:
    """One run's row from its small files (``_Unreadable`` for another user's private run)."""
    now = time.time() if now is None else now
    if not os.access(run.path, os.R_OK | os.X_OK):
        raise _Unreadable(str(run.path))
    try:
        plan, result = read_plan(run), _read(run.result_json)
    except PermissionError as exc:
        raise _Unreadable(str(run.path)) from exc
    except ValueError as exc:  # a damaged plan.json too (PlanRecordError)
        return RunRow(None, "damaged", _started_of(run), None, None, str(exc), str(run.path))
    launcher, status = _tolerant(run.launcher_json), _tolerant(run.status_json)
    tasks = len(plan.tasks) if plan is not None else None
    started = _num(launcher.get("started")) or _started_of(run)
    base = {
        "job": _text(plan.job) if plan else None,
        "run_id": _text(plan.run_id) if plan else None,
        "scheduler": _text(plan.scheduler) if plan else "ssh",
        "purpose": plan.purpose if plan else None,
    }
    if isinstance(result, dict):
        started = _num(result.get("started_ts")) or started
        state = _text(result.get("state"), 40) or "damaged"
        return RunRow(
            **base,
            state=state,
            started=started,
            wall_time_s=_num(result.get("wall_time_s")),
            tasks=tasks,
            root_cause=_root_cause(result.get("root_cause")),
            run_dir=str(run.path),
        )
    try:
        handle = handle_of(run)
        alive = handle.alive()
        queued = alive and handle.queued(handle.scheduler_status())  # e.g. Slurm: PENDING in squeue
    except Exception as exc:  # a scheduler's view must not cost the whole list
        return RunRow(
            **base,
            state="unknown",
            started=started,
            wall_time_s=None,
            tasks=tasks,
            root_cause=f"its scheduler's state could not be read: {exc}",
            run_dir=str(run.path),
        )
    if not alive:
        state = "launcher_gone"
    elif queued:
        state = "pending"
    else:
        state = _text(status.get("state"), 40) or "starting"
    wall = round(now - started, 1) if started is not None and alive else None
    return RunRow(
        **base, state=state, started=started, wall_time_s=wall, tasks=tasks, root_cause=None, run_dir=str(run.path)
    )


def _tolerant(path: Path) -> dict[str, Any]:
    """A file the list can do without (launcher.json, status.json): {} when damaged."""
    try:
        return _obj(_read(path))
    except ValueError:
        return {}


def _started_of(run: RunDir) -> float | None:
    """Without launcher.json (a run submitted and waiting, or a damaged one): when plan.json was written."""
    try:
        return run.plan_json.stat().st_mtime
    except OSError:
        return None


def run_dirs(runs_dir: Path) -> tuple[list[RunDir], int]:
    """The run directories under ``runs_dir`` (and one level down: a sweep's sizes), and how many
    directories could not be looked into (another user's)."""
    found: list[RunDir] = []
    unreadable = 0
    for d in _subdirs(runs_dir):
        try:
            is_run = (d / "plan.json").exists() or (d / "result.json").exists()
        except OSError:
            is_run = False
        if is_run:
            found.append(RunDir(d))
            continue
        if not os.access(d, os.R_OK | os.X_OK):
            unreadable += 1
            continue
        found.extend(RunDir(sub) for sub in _subdirs(d) if (sub / "plan.json").exists())
    return found, unreadable


def _subdirs(path: Path) -> Iterable[Path]:
    try:
        with os.scandir(path) as it:
            for n, entry in enumerate(it):
                if n >= MAX_ENTRIES:
                    return
                try:
                    if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                        yield Path(entry.path)
                except OSError:
                    continue
    except OSError:
        return


def list_runs(
    runs_dir: str | Path,
    handle_of: Callable[[RunDir], RunHandle],
    *,
    states: set[str] | None = None,
    limit: int | None = DEFAULT_LIMIT,
) -> RunList:
    """The runs under ``runs_dir``, newest first, filtered by state, at most ``limit`` (None: all)."""
    base = Path(runs_dir)
    out = RunList()
    if not base.is_dir():
        out.notes.append(f"no runs directory {base}/ (see --runs-dir)")
        return out
    dirs, unreadable = run_dirs(base)
    rows = []
    for run in dirs:
        try:
            rows.append(read_run(run, handle_of))
        except _Unreadable:
            unreadable += 1
    if unreadable:
        out.notes.append(
            f"{unreadable} run director{'y' if unreadable == 1 else 'ies'} of other users skipped (not readable)"
        )
    damaged = sum(1 for r in rows if r.state == "damaged")
    if damaged:
        out.notes.append(
            f"{damaged} damaged run director{'y' if damaged == 1 else 'ies'} (unreadable plan.json or result.json)"
        )
    if states:
        out.filtered = True
        rows = [r for r in rows if r.state in states]
    rows.sort(key=lambda r: (r.started or 0.0, r.run_dir), reverse=True)
    out.total = len(rows)
    out.runs = rows if limit is None else rows[:limit]
    return out


def runs_text(listing: RunList, now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = [("JOB", "STATE", "STARTED", "WALL", "TASKS", "ROOT CAUSE", "RUN DIR")]
    for r in listing.runs:
        rows.append(
            (
                (r.job or "?") + (" (check)" if r.purpose == "check" else ""),
                r.state,
                _when(r.started, now),
                _duration(r.wall_time_s),
                "" if r.tasks is None else str(r.tasks),
                _clip(r.root_cause or "", 60),
                r.run_dir,
            )
        )
    lines = table(rows) if listing.runs else ["no runs" + (" in these states" if listing.filtered else "")]
    if listing.total > len(listing.runs):
        lines.append(f"({listing.total - len(listing.runs)} older not shown: --limit)")
    lines += [f"note: {n}" for n in listing.notes]
    return "\n".join(lines)


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    local = time.localtime(ts)
    return time.strftime("%H:%M:%S" if now - ts < 12 * 3600 else "%Y-%m-%d %H:%M", local)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    return f"{s // 3600:.0f}h{(s % 3600) // 60:02.0f}m"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
