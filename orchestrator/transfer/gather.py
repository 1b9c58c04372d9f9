"""Bring back every task's complete log and exit status, and the chief's checkpoints. Verified.

Hosts are gathered in parallel; per file see ``fetch``. An interrupted gather resumes: verified
files are recorded in RUN/gather-state.json (with the node's size and mtime) and not copied again.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from worker_entry import protocol as p

from ..backends import Connection
from ..events import EventBus
from ..events.kinds import GatherFailed, GatherFinished, GatherStarted, JobWarning
from ..plan import NodePlan, Plan
from ..runs import RunDir, write_bytes_atomic
from .fetch import StopCheck, fetch, items_of, list_files
from .paths import UnsafePath, real_dirs
from .state import GatherState, Item, Progress, Totals, check_space


def gather_after_run(
    spec: Any,
    plan: Plan,
    conns: Mapping[str, Connection | None],
    rundir: RunDir,
    bus: EventBus,
    *,
    attempts: int,
    stop: StopCheck | None = None,
) -> dict[str, Any]:
    """Logs + exit status of every task and attempt; the chief's checkpoints. Returns a summary.

    Hosts are gathered in parallel; a task's node-side log is copied only when it differs in size
    from what arrived live (then the node's copy completes RUN/logs/).
    """
    bus.emit(GatherStarted(attempts=attempts))
    state = GatherState.load(rundir.gather_state_json)
    totals = Totals()
    reachable = []
    for node in plan.nodes:
        conn = conns.get(str(node.task))
        if conn is None or not conn.is_alive():
            totals.errors.append(f"{node.task} ({node.host}): host not reachable; its node-side logs were not gathered")
        else:
            reachable.append((node, conn))

    def listing(pair: tuple[NodePlan, Connection]) -> tuple[NodePlan, Connection, list[p.Manifest] | str]:
        node, conn = pair
        roots = [f"{node.remote_dir}/attempt-{a}" for a in range(attempts)]
        if node.is_chief and spec.checkpoint.gather:
            roots.append(node.checkpoint_dir)
        clean = [] if node.is_chief else [node.checkpoint_dir, node.backup_dir]
        try:
            return node, conn, list_files(conn, node.argv[0], roots, clean)
        except Exception as exc:
            return node, conn, f"{node.task} ({node.host}): {exc}"

    workers = max(1, min(16, len(reachable)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listed = list(pool.map(listing, reachable))

    ckpt_summary: dict[str, Any] = {"gathered": False}
    logs_summary: dict[str, str] = {}
    work: list[tuple[NodePlan, Connection, list[tuple[str, list[Item]]]]] = []
    for node, conn, manifests in listed:
        if isinstance(manifests, str):
            totals.errors.append(manifests)
            continue
        jobs: list[tuple[str, list[Item]]] = []
        for a in range(attempts):
            m = manifests[a]
            key = f"{node.task}" + (f" attempt {a}" if a else "")
            if not m.exists:
                logs_summary[key] = "no node-side directory"
                continue
            dest = rundir.gather_dir / node.task.slug / f"attempt-{a}"
            try:
                items = items_of(m, real_dirs(rundir.path, dest), totals)
            except UnsafePath as exc:  # a link planted in the run: that task's files are not written through it
                totals.errors.append(f"{node.task}: {exc}")
                continue
            live = rundir.task_log(node.task.slug, a)
            live_size = live.stat().st_size if live.is_file() else -1
            # (by where it lands: "./output.log" is output.log too, and was copied past the cap)
            node_log = next((i for i in items if i.dest == dest / "output.log"), None)
            cut = rundir.cut_from(str(node.task))
            if node_log is not None and cut is not None and a >= cut:
                items.remove(node_log)  # the launcher's cap, not a loss: the node keeps it
                logs_summary[key] = f"cut by logs.max_bytes_per_task; the node keeps its complete log in {m.root}"
            elif node_log is not None and node_log.size == live_size:
                items.remove(node_log)
                logs_summary[key] = f"complete: all {live_size} bytes arrived live"
            elif node_log is not None:
                logs_summary[key] = f"completed from the node: {node_log.size - max(live_size, 0)} bytes missed live"
            jobs.append((m.root, items))
        if node.is_chief and spec.checkpoint.gather:
            m = manifests[-1]
            ckpt_summary = {
                "gathered": m.exists,
                "source": f"{node.host}:{m.root}",
                "task": str(node.task),
            }
            if m.exists:
                try:
                    jobs.append((m.root, items_of(m, real_dirs(rundir.path, rundir.checkpoints_dir), totals)))
                except UnsafePath as exc:
                    totals.errors.append(f"{node.task}: {exc}")
                    ckpt_summary["gathered"] = False
        work.append((node, conn, jobs))

    progress = Progress(sum(it.size for _, _, jobs in work for _, items in jobs for it in items))

    pending = [
        it
        for _, _, jobs in work
        for _, items in jobs
        for it in items
        if not state.verified(it.dest, it.size, it.mtime_ns)
    ]
    if not check_space(rundir.path, pending, totals):
        work = []
    progress = Progress(sum(it.size for _, _, jobs in work for _, items in jobs for it in items))

    def copy(entry: tuple[NodePlan, Connection, list[tuple[str, list[Item]]]]) -> Totals:
        node, conn, jobs = entry
        mine = Totals()
        try:
            for root, items in jobs:
                fetch(conn, node.argv[0], root, items, state, mine, progress, stop)
        except Exception as exc:  # one node never stops the others
            mine.errors.append(f"{type(exc).__name__}: {exc}")
        # every error says whose: nodes are copied in parallel, and a file's name alone named no task
        who = f"{node.task} ({node.host}): "
        mine.errors[:] = [e if e.startswith(who) else who + e for e in mine.errors]
        return mine

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(work)))) as pool:
            for t in pool.map(copy, work):
                totals.merge(t)
    finally:
        progress.close()
        state.save()
    for node, _, _ in work:
        for a in range(attempts):
            complete_live_log(rundir, node, a, rundir.gather_dir / node.task.slug / f"attempt-{a}", bus)
    return summarize(totals, logs_summary, ckpt_summary, rundir, bus)


def summarize(
    totals: Totals, logs: dict[str, str], checkpoints: dict[str, Any] | None, rundir: RunDir, bus: EventBus
) -> dict[str, Any]:
    """result.json's ``gather`` and the gather events, for a gather or a hand-over."""
    summary = {
        "files": totals.files,
        "bytes": totals.bytes,
        "already_verified": totals.skipped_verified,
        "resumed_files": totals.resumed_files,
        "resumed_bytes": totals.resumed_bytes,
        "skipped": totals.skipped,
        "errors": totals.errors,
        "interrupted": totals.interrupted,
        "logs": logs,
        "checkpoints": checkpoints or {"gathered": False},
        "dest": str(rundir.path),
    }
    if totals.errors:
        bus.emit(GatherFailed(message="; ".join(totals.errors[:3]), errors=totals.errors))
    bus.emit(
        GatherFinished(
            files=totals.files,
            bytes=totals.bytes,
            dest=str(rundir.path),
            already_verified=totals.skipped_verified,
            skipped=len(totals.skipped),
            errors=len(totals.errors),
        )
    )
    return summary


def complete_live_log(rundir: RunDir, node: NodePlan, attempt: int, dest: Path, bus: EventBus) -> None:
    """If lines never arrived live (a broken channel, a full disk), the node's copy completes RUN/logs/."""
    node_log = dest / "output.log"
    live = rundir.task_log(node.task.slug, attempt)
    if not node_log.is_file():
        return
    live_size = live.stat().st_size if live.is_file() else 0
    node_size = node_log.stat().st_size
    if node_size > live_size:
        with open(node_log, "rb") as src:
            write_bytes_atomic(live, iter(lambda: src.read(1 << 20), b""))
        bus.emit(
            JobWarning(
                task=str(node.task),
                host=node.host,
                message=f"{node_size - live_size} bytes of {node.task}'s output never arrived live; "
                f"{live} was completed from the node's copy",
            )
        )


def gather_checkpoint(
    node: NodePlan, conn: Connection, rundir: RunDir, state: GatherState, totals: Totals, stop: StopCheck | None = None
) -> dict[str, Any]:
    """The chief's checkpoint over a helper connection: the fall-back when its hand-over could not bring
    it (its node closed the channel first). Errors go to ``totals``; the summary says what happened."""
    summary: dict[str, Any] = {
        "gathered": False,
        "task": str(node.task),
        "source": f"{node.host}:{node.checkpoint_dir}",
    }
    before = len(totals.errors)
    try:
        (m,) = list_files(conn, node.argv[0], [node.checkpoint_dir], [])
        summary["source"] = f"{node.host}:{m.root}"
        if not m.exists:
            return summary
        items = items_of(m, real_dirs(rundir.path, rundir.checkpoints_dir), totals)
        if not check_space(
            rundir.path, [it for it in items if not state.verified(it.dest, it.size, it.mtime_ns)], totals
        ):
            return summary
        progress = Progress(sum(it.size for it in items))
        try:
            fetch(conn, node.argv[0], m.root, items, state, totals, progress, stop)
        finally:
            progress.close()
    except Exception as exc:
        totals.errors.append(f"{node.task} ({node.host}): checkpoint not gathered: {type(exc).__name__}: {exc}")
        return summary
    summary["gathered"] = len(totals.errors) == before and not totals.interrupted
    return summary
