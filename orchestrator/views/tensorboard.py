"""The end of a run in TensorBoard: its goodput and whole-run throughput, as ``report`` computes them.

The live sink (``sinks.tensorboard``) writes what the supervisor sees while the job runs; goodput needs
the run's end (result.json, the gather), so this writes it once the run is recorded — called by the
command that ran it (``launch``, ``slurm-batch``, each size of ``scale``). Once: a marker made with
O_EXCL in the job's TensorBoard run says it is written (a Slurm run's follower and its batch job both
see the end). It reads heartbeats.jsonl as ``report`` does: a cost paid once, after the job.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ..runs import RunDir
from ..sinks.tensorboard import JOB_RUN, EventFiles, Point
from ..supervise.figures import Figures, throughput
from .goodput import goodput_report
from .goodputmodel import CATEGORIES
from .records import event_records, heartbeat_records, is_number, json_object

MARKER = ".end-written"


def end_scalars(run: RunDir, records: list[dict[str, Any]] | None = None) -> tuple[int, float, dict[str, float]] | None:
    """(step, wall time, values) of the run's end: goodput (percent, and seconds per category), the cost
    of its failures (``recovery/``: loss to training again, work redone, summed over them) and the
    whole run's steps/s and examples/s; None before the run ended."""
    result = json_object(run, run.result_json)
    if not result:
        return None
    records = heartbeat_records(run.heartbeats_jsonl) if records is None else records
    g = goodput_report(event_records(run.events_jsonl), records, result, True)
    figures = Figures()
    for rec in records:
        figures.add(rec["task"], rec)
    final = figures.final()
    values: dict[str, float] = {}
    if g is not None:
        if is_number(g.goodput):
            values["goodput/goodput_pct"] = float(g.goodput) * 100.0
        if is_number(g.wall_s):
            values["goodput/wall_s"] = float(g.wall_s)
        for key in CATEGORIES:
            if is_number(g.seconds.get(key)):
                values[f"goodput/{key}"] = float(g.seconds[key])
        for key, value in (g.recovery or {}).items():  # the cost of failures (views.recovery)
            if is_number(value):
                values[f"recovery/{key}"] = float(value)
    for key, value in throughput(final).items():
        if value is not None:
            values[f"run/{key}"] = float(value)
    step = max((f.steps or 0 for f in final.values()), default=0)
    ended = result.get("ended_ts")
    return step, float(ended) if is_number(ended) else os.path.getmtime(run.result_json), values


def write_end(run: RunDir, records: list[dict[str, Any]] | None = None) -> Path | None:
    """Write the run's end into its TensorBoard directory (launcher.json's ``tensorboard_dir``) once;
    the directory written to, or None (no TensorBoard for this run, or already written). ``records``:
    the run's heartbeat records when the caller read them (the run's summary uses them too)."""
    info: dict[str, Any] = json_object(run, run.launcher_json)
    root = info.get("tensorboard_dir")
    if not isinstance(root, str) or not root:
        return None
    end = end_scalars(run, records)
    if end is None or not end[2] or end[0] == 0:
        # no training step: no curve to end (and no tensorboardX import, ~0.2 s of the launcher's CPU,
        # for a job that trained nothing: docs/benchmarks.md §1)
        return None
    job_dir = Path(root) / JOB_RUN
    try:
        job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(job_dir / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    os.close(fd)
    files = EventFiles(Path(root), suffix=".end")
    try:
        files.add(Point(JOB_RUN, *end))
    finally:
        files.close()
    with contextlib.suppress(OSError):
        os.chmod(job_dir, 0o700)
    return Path(root)
