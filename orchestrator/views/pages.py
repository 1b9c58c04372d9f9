"""The pictures of a report and of a sweep, and the HTML page that holds them (``plots`` draws,
``htmlpage`` writes the page).

Everything a page shows is taken from the run directory or the sweep's summary; the page is one
self-contained file (the PNGs inlined) that can be mailed or attached to a ticket. The report page is
made of the report's data, not of its text: a table of the workers, the advice as wrapped text,
goodput as a bar, plots on zero-based axes with their spread stated. Past ``FULL_UP_TO`` workers it
shows their distribution (percentiles, a histogram, the step time's bands over the run) and the
outliers' rows and lines (``outliers.shown``), never a bar or a line per worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..events.kinds import Straggler
from ..runs import RunDir, private_subdir, write_bytes_atomic
from ..supervise.summary import FULL_UP_TO
from . import lossplots, plots
from .control import throughput_lines
from .evaluations import evaluation_section
from .htmlpage import Page
from .loss import loss_lines
from .noise_scale import noise_lines
from .outliers import percentiles, shown
from .pace import pace_lines
from .records import event_records, heartbeat_records
from .reportmodel import Report, flat_workers
from .reporttext import over
from .split import split_lines, split_workers

#: The workers table: (heading, the worker's field, format); "after" and "step" are derived.
WORKER_COLUMNS = (
    ("task", None, ""),
    ("host", "host", ""),
    ("steps", "steps", "d"),
    ("step ms", "step", ".1f"),
    ("steps/s", "steps_per_s", ".1f"),
    ("examples/s", "examples_per_s", ",.0f"),
    ("input ms", "input_ms", ".1f"),
    ("compute ms", "compute_ms", ".1f"),
    ("in all-reduce ms", "collective_ms", ".1f"),
    ("after ms", "after", ".1f"),
    ("own work ms", "pre_collective_ms", ".1f"),
    ("rel", "relative_score", ".2f"),
    ("ind", "individual_score", ".2f"),
    ("cpu wait %", "wait_pct", ".0f"),
    ("cpu %", "cpu_pct", ".0f"),
    ("rss MB", "rss_mb_max", ".0f"),
)


def step_series(run: RunDir, records: list[dict[str, Any]] | None = None) -> dict[str, list[tuple[float, float]]]:
    """Per task (ts, step ms): the step-clock windows, or the progress records' step time without them.
    ``records``: the run's ``heartbeat_records`` when the caller holds them (read once, not twice)."""
    windows: dict[str, list[tuple[float, float]]] = {}
    progress: dict[str, list[tuple[float, float]]] = {}
    for rec in heartbeat_records(run.heartbeats_jsonl) if records is None else records:  # numbers are numbers
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


def _step_ms(w: Mapping[str, Any]) -> float | None:
    if w.get("step_ms") is not None:
        return float(w["step_ms"])
    return None if w.get("step_time_s") is None else 1000.0 * float(w["step_time_s"])


def _cell(w: Mapping[str, Any], key: str | None, fmt: str) -> Any:
    if key == "step":
        v: Any = _step_ms(w)
    elif key == "after":
        v = None if w.get("update_ms") is None else float(w["update_ms"]) + float(w.get("host_ms") or 0)
    else:
        v = w.get(key) if key else None
    if v is None:
        return "-"
    if fmt == "d":
        return int(v)
    return format(v, fmt) if fmt and isinstance(v, (int, float)) else str(v)


def _workers_section(page: Page, workers: Mapping[str, Mapping[str, Any]], stragglers: set[str]) -> list[str]:
    """The workers' table (every one, or the distribution and the outliers); the tasks listed."""
    listed, spread = shown(workers, stragglers)
    if spread:
        page.p(spread[0])
        rows = []
        for label, key in (("step ms", "step_ms"), ("own work ms", "pre_collective_ms"), ("steps/s", "steps_per_s")):
            vals = [float(w[key]) for w in workers.values() if isinstance(w.get(key), (int, float))]
            if vals:
                rows.append([label, *(f"{v:.1f}" for _, v in percentiles(vals))])
        if rows:
            page.table(["of all workers", *(f"p{q}" for q, _ in percentiles([0.0]))], rows)
    head = [h for h, _, _ in WORKER_COLUMNS]
    rows = [[t, *(_cell(workers[t], key, fmt) for _, key, fmt in WORKER_COLUMNS[1:])] for t in listed]
    page.table(head, rows, flagged={i for i, t in enumerate(listed) if t in stragglers})
    page.p("rel: the worker's own work against the fastest (1.00 = as fast); ind: against its own earlier steps.")
    return listed


def _slowest(means: Mapping[str, float], named: set[str], top: int = 5) -> list[str]:
    """The workers to mark on a distribution: the stragglers and, of the ``top`` slowest, those 10 %
    or more slower than the median (the fastest and the crowd are the bands)."""
    if not means:
        return []
    ranked = sorted(means, key=lambda t: means[t])
    median = means[ranked[len(ranked) // 2]]
    slow = {t for t in ranked[-top:] if means[t] >= 1.1 * median}
    return sorted(slow | (named & set(means)), key=lambda t: means[t])


def report_page(
    run: RunDir,
    rep: Report,
    text: str,
    out: Path | None = None,
    records: list[dict[str, Any]] | None = None,
    series: dict[str, list[tuple[float, float]]] | None = None,
) -> tuple[Path, list[Path]]:
    """RUN/report/{report.html, step_times.png, time_split.png (, step_hist.png)}: what `report --html` writes.
    ``records``: the heartbeat records the report was built from (a 4,096-task run's file is read once);
    ``series``: the step-time picture's ``step_series`` when the run's summary holds it (no records read)."""
    out = private_subdir(out or run.path / "report")
    workers = flat_workers(rep.workers)  # the table's and the pictures' rows (the outliers' ranking reads them)
    named = rep.straggler_tasks()
    page = Page(f"tfcluster report: {rep.job}")
    page.p(f"run directory {rep.run_dir}")
    if rep.goodput:
        page.h2("Goodput: where the wall time went")
        page.goodput_bar(rep.goodput)
    page.h2("Advice")
    page.ul(list(rep.advice) or ["nothing to advise"])
    page.h2(f"Workers ({len(workers)})")
    listed = _workers_section(page, workers, named)
    for line in throughput_lines(dict(rep.throughput)):
        page.p(line.strip())
    if rep.split:
        page.h2("Where a step goes")
        page.pre("\n".join(split_lines(rep.split, over(rep))))
        if rep.efficiency is not None:
            page.p(
                f"scaling efficiency ≈ {rep.efficiency:.0%} (time outside the all-reduce and the wait for the "
                "slowest worker / step time: N workers give efficiency x N times one worker)"
            )
    if rep.stragglers or rep.slowing:
        page.h2("Stragglers and slowing workers")
        page.ul([f"{s.task} ({s.host}): {s.message}" for s in [*rep.stragglers, *rep.slowing]])
    evaluation_section(page, dict(rep.evaluations or {}))
    if rep.pace:
        page.h2("Pace")
        page.pre("\n".join(pace_lines(rep.pace)))
    gm = rep.gpu_models
    if gm.per_host:
        page.h2("GPUs" + (" (mixed models: every step waits for the slowest GPU)" if gm.mixed else ""))
        page.table(["host", "GPUs"], [[h, ", ".join(m)] for h, m in gm.per_host.items()])
    images = _run_images(run, rep, out, workers, listed, step_series(run, records) if series is None else series)
    if rep.loss or rep.noise_scale.windows:
        page.h2("Training loss and the gradient noise scale")
        page.pre("\n".join([*loss_lines(rep.loss), "", *noise_lines(rep.noise_scale)]))
        images.append(
            (
                "Training loss against steps, and B_simple (smoothed; band: ± one standard error) over the same steps",
                lossplots.loss_and_noise(rep.loss, rep.noise_scale, out / "loss.png"),
            )
        )
    page.h2("Pictures")
    for caption, png in images:
        page.figure(caption, png)
    page.details("the text report (tfcluster report)", text)
    write_bytes_atomic(out / "report.html", page.render().encode(), durable=False)
    return out / "report.html", [p for _, p in images]


def _run_images(
    run: RunDir,
    rep: Report,
    out: Path,
    workers: Mapping[str, Any],
    listed: list[str],
    series: dict[str, list[tuple[float, float]]],
) -> list[tuple[str, Path]]:
    marks = [(float(s.ts), str(s.task)) for s in rep.stragglers if isinstance(s.ts, int | float)]
    many = len(series) > plots.LINES_UP_TO
    means = {t: v for t, w in rep.workers.items() if (v := w.step_ms) is not None}
    outliers = _slowest(means, rep.straggler_tasks()) if many else []
    caption = (
        "Step time of every worker over the run: median, p10-p90 and min-max bands; the slowest in red"
        if many
        else "Step time per worker over the run (dashed: a straggler named)"
    )
    images = [
        (caption + "; the axis starts at zero", plots.step_times(series, marks, out / "step_times.png", named=outliers))
    ]
    if len(workers) > FULL_UP_TO:
        images.append(
            (
                "How many workers take how long per step (dashed: the slowest and the stragglers)",
                plots.histogram(means, out / "step_hist.png", named=_slowest(means, rep.straggler_tasks())),
            )
        )
    parts = worker_parts({t: workers[t] for t in listed})
    if parts:
        which = "each listed worker's (the outliers')" if len(workers) > FULL_UP_TO else "each worker's"
        images.append(
            (f"Where {which} step goes (ms, step-clock means)", plots.time_split(parts, out / "time_split.png"))
        )
    return images


def sweep_page(summary: Mapping[str, Any], text: str, root: Path) -> tuple[Path, list[Path]]:
    """SWEEP/{scale.html, scaling.png, split_by_size.png, step_times_N.png (, step_hist_N.png)}."""
    sizes = summary.get("sizes") or []
    unit = str(summary.get("unit") or "examples/s")
    images = [
        (
            "Throughput and scaling efficiency against workers (dashed: ideal)",
            plots.scaling(sizes, unit, root / "scaling.png"),
        )
    ]
    if any((s.get("loss") or {}).get("points") for s in sizes):
        images.append(
            (
                "Training loss against the examples each size trained on (statistical efficiency: the same curve "
                "means every example helped as much at every size)",
                lossplots.loss_by_size(sizes, root / "loss_by_size.png", summary.get("target_loss")),
            )
        )
    by_size = {f"{s['workers']} workers": split_parts(s["split"]) for s in sizes if s.get("split")}
    if by_size:
        images.append(
            (
                "Where a step goes at each size (ms, the median worker)",
                plots.time_split(by_size, root / "split_by_size.png", title="Step split per size"),
            )
        )
    largest = max(
        (s for s in sizes if s.get("run_dir") and RunDir(Path(s["run_dir"])).plan_json.exists()),
        key=lambda s: s["workers"],
        default=None,
    )
    if largest is not None:
        run = RunDir(Path(largest["run_dir"]))
        marks = [(e.ts, str(e.task)) for e in event_records(run.events_jsonl) if isinstance(e, Straggler)]
        n = largest["workers"]
        per_worker = largest.get("per_worker") or {}
        listed, _ = shown(per_worker, {t for _, t in marks})
        series = step_series(run)
        many = len(series) > plots.LINES_UP_TO
        means = {t: v for t, w in per_worker.items() if (v := _step_ms(w)) is not None}
        what = "median, p10-p90 and min-max bands; the slowest in red" if many else "dashed: a straggler named"
        named = _slowest(means, {t for _, t in marks}) if many else []
        images.append(
            (
                f"Step time per worker at {n} workers ({what}); the axis starts at zero",
                plots.step_times(series, marks, root / f"step_times_{n}.png", named=named),
            )
        )
        if len(means) > FULL_UP_TO:
            images.append(
                (
                    f"How many workers take how long per step at {n} workers",
                    plots.histogram(means, root / f"step_hist_{n}.png", named=_slowest(means, {t for _, t in marks})),
                )
            )
        parts = worker_parts({t: per_worker[t] for t in listed})
        if parts:
            which = "each listed worker's (the outliers')" if len(per_worker) > FULL_UP_TO else "each worker's"
            images.append(
                (f"Where {which} step goes at {n} workers (ms)", plots.time_split(parts, root / f"time_split_{n}.png"))
            )
    page = Page("tfcluster scale")
    advice = [a.get("advice") for a in summary.get("advice") or [] if isinstance(a, Mapping) and a.get("advice")]
    if advice:
        page.h2("Advice")
        page.ul(advice)
    page.h2("The sweep")
    page.pre(text)
    page.h2("Pictures")
    for caption, png in images:
        page.figure(caption, png)
    write_bytes_atomic(root / "scale.html", page.render().encode(), durable=False)
    return root / "scale.html", [p for _, p in images]
