"""The end of an attempt, over the tasks' own channels: complete the logs, bring the checkpoint, say bye.

When a task ends its node sends ``task_files`` (its task directory, the size of the log it wrote, the
chief's checkpoint listing) and keeps the channel open. Here, per task and in parallel: the log is
fetched only if bytes are missing from what arrived live (with the node's ``exit.json``: the task's
exit status itself is in result.json, from the node's ``exited`` message), the chief's checkpoint is
fetched on the same channel (after checking free space), and ``bye`` lets the node exit. A job whose output all arrived live costs no new SSH channel.
A lost host is not waited for: its logs stay on the node for ``tfcluster gather RUN``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from worker_entry import protocol as p

from ..backends import wait_readable
from ..events import EventBus
from ..runs import RunDir
from ..supervise import TaskSession
from ..supervise.session import Output, Violation
from .fetch import StopCheck, fetch_over, items_of
from .gather import complete_live_log
from .paths import real_dirs
from .state import GatherState, Progress, Totals, check_space

FILES_TIMEOUT_S = 5.0  # a task that said exited sends task_files right after it


@dataclass
class HandOver:
    """What the hand-over of one attempt did (merged into result.json's ``gather``)."""

    totals: Totals = field(default_factory=Totals)
    logs: dict[str, str] = field(default_factory=dict)
    checkpoints: dict[str, Any] | None = None


def hand_over(
    sessions: Sequence[TaskSession],
    rundir: RunDir,
    bus: EventBus,
    state: GatherState,
    on_output: Callable[[str, bytes], None],
    *,
    attempt: int,
    fetch: bool,
    checkpoint: bool,
    stop: StopCheck,
) -> HandOver:
    """``fetch``: complete logs; ``checkpoint``: also the chief's checkpoint."""
    result = HandOver()
    lock = threading.Lock()

    def output(task: str, data: bytes) -> None:
        with lock:
            on_output(task, data)

    def one(s: TaskSession) -> tuple[Totals, dict[str, str], dict[str, Any] | None]:
        totals = Totals()
        logs: dict[str, str] = {}
        ckpt = None
        try:
            ckpt = _one(s, rundir, bus, state, output, totals, logs, attempt, fetch, checkpoint, stop)
        except Exception as exc:  # one node never stops the others
            totals.errors.append(f"{s.task} ({s.host}): {type(exc).__name__}: {exc}")
        finally:
            if s.handing_over:
                s.send(p.Bye())
            s.close()
        return totals, logs, ckpt

    with ThreadPoolExecutor(max_workers=max(1, min(64, len(sessions)))) as pool:
        for totals, logs, ckpt in pool.map(one, sessions):
            result.totals.merge(totals)
            result.logs.update(logs)
            result.checkpoints = ckpt or result.checkpoints
    return result


def _one(
    s: TaskSession,
    rundir: RunDir,
    bus: EventBus,
    state: GatherState,
    output: Callable[[str, bytes], None],
    totals: Totals,
    logs: dict[str, str],
    attempt: int,
    fetch: bool,
    checkpoint: bool,
    stop: StopCheck,
) -> dict[str, Any] | None:
    key = s.task + (f" attempt {attempt}" if attempt else "")
    chief = checkpoint and s.node.is_chief
    if not s.handing_over:
        if fetch and s.exit is None and s.state.value != "not_started":
            logs[key] = "not gathered: the host was lost; `tfcluster gather RUN` fetches its log later"
            totals.errors.append(f"{s.task} ({s.host}): not reachable; its node-side log was not gathered")
        elif fetch and s.exit is not None:
            logs[key] = "not handed over: its node closed the channel after the task ended"
        return _not_handed_over(s, _closed_why(s)) if chief else None
    files = _wait_files(s, output)
    if files is None:
        if fetch:
            totals.errors.append(f"{s.task} ({s.host}): its node did not list its files (an older tfcluster?)")
        return _not_handed_over(s, "its node did not list its files") if chief else None
    if not fetch:
        return None
    node_dir = rundir.gather_dir / s.node.task.slug / f"attempt-{attempt}"
    live = rundir.task_log(s.node.task.slug, attempt)
    live_size = live.stat().st_size if live.is_file() else 0
    cut = rundir.cut_from(s.task)
    if cut is not None and attempt >= cut:
        logs[key] = f"cut by logs.max_bytes_per_task; the node keeps its complete log in {files.task_dir.root}"
    elif files.log_bytes is not None and files.log_bytes <= live_size:
        logs[key] = f"complete: all {live_size} bytes arrived live"
    elif files.log_bytes is not None:
        missed = files.log_bytes - live_size
        logs[key] = f"completed from the node: {missed} bytes missed live"
        # the node's own record of the task's end comes along (the launcher has it from `exited`)
        wanted = (node_dir / "output.log", node_dir / "exit.json")
        items = [it for it in items_of(files.task_dir, real_dirs(rundir.path, node_dir), totals) if it.dest in wanted]
        todo = [it for it in items if not state.verified(it.dest, it.size, it.mtime_ns)]
        if not check_space(rundir.path, todo, totals):  # what a node declares, checked before it is fetched
            logs[key] = f"not completed: {missed} bytes missed live; not enough space to fetch them"
        elif fetch_over(
            s.channel,
            s.decoder,
            files.task_dir.root,
            items,
            state,
            totals,
            Progress(0, False),
            _frames_to(s, output),
            stop,
        ):
            complete_live_log(rundir, s.node, attempt, node_dir, bus)
    if not (checkpoint and s.node.is_chief):
        return None
    return _checkpoint(s, files, rundir, state, output, totals, stop)


def _closed_why(s: TaskSession) -> str:
    if s.violation is not None:
        return f"its node broke the protocol ({s.violation})"
    if s.exit is None:
        return "the task never reported its end (its host was lost?)"
    return "its node closed the channel after the task ended, before the hand-over"


def _not_handed_over(s: TaskSession, why: str) -> dict[str, Any]:
    """The chief's checkpoint could not come over its channel: the summary says why, and the caller
    (``job.transfers``) falls back to fetching it over a helper connection."""
    return {"gathered": False, "task": s.task, "source": f"{s.host}:{s.node.checkpoint_dir}", "why": why}


def _checkpoint(
    s: TaskSession,
    files: p.TaskFiles,
    rundir: RunDir,
    state: GatherState,
    output: Callable[[str, bytes], None],
    totals: Totals,
    stop: StopCheck,
) -> dict[str, Any]:
    listing = files.checkpoint
    summary: dict[str, Any] = {"gathered": False, "task": s.task}
    if listing is None:
        why = "its listing is too large for the job channel" if not files.checkpoint_listed else "not listed"
        totals.errors.append(f"{s.task}: checkpoint not gathered ({why}); run `tfcluster gather RUN`")
        return summary
    summary["source"] = f"{s.host}:{listing.root}"
    if not listing.exists:
        return summary
    items = items_of(listing, real_dirs(rundir.path, rundir.checkpoints_dir), totals)
    if not check_space(rundir.path, [it for it in items if not state.verified(it.dest, it.size, it.mtime_ns)], totals):
        return summary
    progress = Progress(sum(it.size for it in items))
    try:
        ok = fetch_over(s.channel, s.decoder, listing.root, items, state, totals, progress, _frames_to(s, output), stop)
    finally:
        progress.close()
    summary["gathered"] = ok
    return summary


def _wait_files(s: TaskSession, output: Callable[[str, bytes], None]) -> p.TaskFiles | None:
    """The task's ``task_files`` (already received, or arriving now), reading its channel meanwhile."""
    deadline = time.monotonic() + FILES_TIMEOUT_S
    while s.files is None and s.channel is not None and time.monotonic() < deadline:
        wait_readable(s.channel.filenos(), 0.2)
        out, err, eof = s.channel.read()
        for item in s.receive(out, err):
            if isinstance(item, Output):
                output(s.task, item.data)
            elif isinstance(item, Violation):
                return None
        if eof:
            break
    return s.files


def _frames_to(s: TaskSession, output: Callable[[str, bytes], None]) -> Callable[[p.Frame], None]:
    """Output lines that still arrive on the channel during a transfer go to the task's log."""
    return lambda fr: output(s.task, fr.payload)
