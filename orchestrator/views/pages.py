"""The pictures of a report and of a sweep, and the HTML page that holds them (``plots`` draws).

Everything a page shows is taken from the run directory or the sweep's summary; the page is one
self-contained file (the PNGs inlined) that can be mailed or attached to a ticket.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..events.kinds import Straggler
from ..runs import RunDir, write_bytes_atomic
from . import plots
from .records import event_records, heartbeat_records
from .split import split_workers


def step_series(run: RunDir) -> dict[str, list[tuple[float, float]]]:
    """Per task (ts, step ms): the step-clock windows, or the progress records' step time without them."""
    windows: dict[str, list[tuple[float, float]]] = {}
    progress: dict[str, list[tuple[float, float]]] = {}
    for rec in heartbeat_records(run.heartbeats_jsonl):  # checked: numbers are numbers
        task, ts = rec["task"], rec.get("ts")
        if ts is None:
            continue
        if rec.get("kind") == "profile":
            if rec.get("step_ms") is not None:
                windows.setdefault(task, []).append((float(ts), float(rec["step_ms"])))
        elif rec.get("progress"):
            st = rec["progress"].get("step_time_s")
            if st is not None and st > 0:
                progress.setdefault(task, []).append((float(ts), 1000.0 * st))
    return windows or progress


def worker_parts(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each worker's step in the picture's parts: its wait inside the all-reduce for the slowest
    worker apart from the all-reduce itself (the least any worker spends in it)."""
    have, allreduce = split_workers(workers)
    return {
        t: {
            "input": float(w.get("input_ms") or 0),
            "compute": float(w.get("compute_ms") or 0),
            "wait": float(w["collective_ms"]) - allreduce,
            "collective": float(allreduce),
            "post_collective": float(w.get("update_ms") or 0) + float(w.get("host_ms") or 0),
            "other": float(w.get("other_ms") or 0),
        }
        for t, w in have.items()
    }


def split_parts(split: Mapping[str, Any]) -> dict[str, float]:
    """A job split (``split.job_split``) in the picture's parts."""
    return {
        "input": float(split.get("input_ms") or 0),
        "compute": float(split.get("compute_ms") or 0),
        "wait": float(split.get("waiting_for_slowest_ms") or 0),
        "collective": float(split.get("allreduce_ms") or 0),
        "post_collective": float(split.get("after_allreduce_ms") or 0),
        "other": float(split.get("other_ms") or 0),
    }


def report_page(run: RunDir, rep: Mapping[str, Any], text: str, out: Path | None = None) -> tuple[Path, list[Path]]:
    """RUN/report/{report.html, step_times.png, time_split.png}: what `report --html` writes."""
    out = out or run.path / "report"
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    marks = [(float(s["ts"]), str(s.get("task"))) for s in rep.get("stragglers") or [] if isinstance(s.get("ts"), int | float)]
    images = [("Step time per worker over the run (dashed: a straggler named)", plots.step_times(step_series(run), marks, out / "step_times.png"))]
    parts = worker_parts(rep.get("workers") or {})
    if parts:
        images.append(("Where each worker's step goes (ms, step-clock means)", plots.time_split(parts, out / "time_split.png")))
    page = plots.html_page(f"tfcluster report: {rep.get('job')}", text, images)
    write_bytes_atomic(out / "report.html", page.encode(), durable=False)
    return out / "report.html", [p for _, p in images]


def sweep_page(summary: Mapping[str, Any], text: str, root: Path) -> tuple[Path, list[Path]]:
    """SWEEP/{scale.html, scaling.png, split_by_size.png, step_times_N.png}."""
    sizes = summary.get("sizes") or []
    unit = str(summary.get("unit") or "examples/s")
    images = [("Throughput and scaling efficiency against workers (dashed: ideal)", plots.scaling(sizes, unit, root / "scaling.png"))]
    by_size = {f"{s['workers']} workers": split_parts(s["split"]) for s in sizes if s.get("split")}
    if by_size:
        images.append(("Where a step goes at each size (ms, the median worker)", plots.time_split(by_size, root / "split_by_size.png", title="Step split per size")))
    largest = max((s for s in sizes if s.get("run_dir") and RunDir(Path(s["run_dir"])).plan_json.exists()), key=lambda s: s["workers"], default=None)
    if largest is not None:
        run = RunDir(Path(largest["run_dir"]))
        marks = [(e.ts, str(e.task)) for e in event_records(run.events_jsonl) if isinstance(e, Straggler)]
        n = largest["workers"]
        images.append((f"Step time per worker at {n} workers (dashed: a straggler named)", plots.step_times(step_series(run), marks, root / f"step_times_{n}.png")))
        parts = worker_parts(largest.get("per_worker") or {})
        if parts:
            images.append((f"Where each worker's step goes at {n} workers (ms)", plots.time_split(parts, root / f"time_split_{n}.png")))
    page = plots.html_page("tfcluster scale", text, images)
    write_bytes_atomic(root / "scale.html", page.encode(), durable=False)
    return root / "scale.html", [p for _, p in images]
