"""Pictures of a run or a scaling sweep (matplotlib, PNG) and a self-contained HTML page around them.

Plain data in, files out: the report and the sweep decide what to show. matplotlib is imported only
here, with the non-interactive Agg backend, and is an optional dependency (`tfcluster[plots]`).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..runs import write_bytes_atomic

#: Colors of the parts of a step, in stacking order (input first, the work after the all-reduce last).
PART_COLORS = {
    "input": "#4e79a7",
    "compute": "#59a14f",
    "wait": "#f28e2b",
    "collective": "#e15759",
    "post_collective": "#9c755f",
    "other": "#bab0ac",
}


PART_LABELS = {
    "input": "input pipeline",
    "compute": "compute",
    "wait": "waiting for the slowest",
    "collective": "the all-reduce itself",
    "post_collective": "after the all-reduce",
    "other": "unattributed",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("pictures need matplotlib: pip install 'tfcluster[plots]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


#: More workers than this: the step-time picture is their distribution over time, not a line each.
LINES_UP_TO = 32


def _spread_note(values: Sequence[float]) -> str:
    """The spread of the values as words, so a zero-based axis loses nothing (a 5 % wobble stays 5 %)."""
    vals = sorted(values)
    if not vals:
        return ""
    mid = vals[len(vals) // 2]
    pct = 100.0 * (vals[-1] - vals[0]) / mid if mid > 0 else 0.0
    return f"min {vals[0]:.1f} ms, median {mid:.1f} ms, max {vals[-1]:.1f} ms (spread {pct:.0f}% of the median)"


def step_times(
    series: Mapping[str, Sequence[tuple[float, float]]],
    marks: Sequence[tuple[float, str]],
    path: Path,
    named: Sequence[str] = (),
) -> Path:
    """Per-worker step time (ms) over the run (seconds from its start); stragglers marked. The axis starts
    at zero (the spread is stated under the title): a 5 % wobble must not look like a collapse. Past
    ``LINES_UP_TO`` workers: the median, p10-p90 band and min-max band of every time bin, and the
    workers named in ``marks`` (the outliers) as lines of their own."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    t0 = min((t for pts in series.values() for t, _ in pts), default=0.0)
    values = [v for pts in series.values() for _, v in pts]
    if len(series) <= LINES_UP_TO:
        for task, pts in sorted(series.items()):
            if pts:
                ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], marker=".", linewidth=1.2, label=task)
    else:
        _distribution(ax, series, t0, {task for _, task in marks} | set(named))
    for ts, task in marks:
        ax.axvline(ts - t0, color="#d62728", linestyle="--", linewidth=1)
        ax.annotate(
            f"straggler: {task}",
            (ts - t0, ax.get_ylim()[1]),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color="#d62728",
        )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("step time (ms)")
    what = "Step time per worker" if len(series) <= LINES_UP_TO else f"Step time of {len(series)} workers"
    ax.set_title(what + (f"\n{_spread_note(values)}" if values else ""), fontsize=10)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8, loc="lower left", ncol=2)
    return _save(fig, plt, path)


def _distribution(ax: Any, series: Mapping[str, Sequence[tuple[float, float]]], t0: float, named: set[str]) -> None:
    """Many workers: per time bin the median, the p10-p90 and min-max bands; the named workers' own lines."""
    span = max((t for pts in series.values() for t, _ in pts), default=t0) - t0
    nbins = 40
    width = span / nbins if span > 0 else 1.0
    bins: list[list[float]] = [[] for _ in range(nbins + 1)]
    for pts in series.values():
        for t, v in pts:
            bins[min(nbins, int((t - t0) / width))].append(v)
    xs, p0, p10, p50, p90, p100 = [], [], [], [], [], []
    for i, vals in enumerate(bins):
        if not vals:
            continue
        vals.sort()
        n = len(vals) - 1
        xs.append((i + 0.5) * width)
        p0.append(vals[0])
        p10.append(vals[round(0.1 * n)])
        p50.append(vals[round(0.5 * n)])
        p90.append(vals[round(0.9 * n)])
        p100.append(vals[-1])
    ax.fill_between(xs, p0, p100, color="#4e79a7", alpha=0.15, label="min-max")
    ax.fill_between(xs, p10, p90, color="#4e79a7", alpha=0.35, label="p10-p90")
    ax.plot(xs, p50, color="#4e79a7", linewidth=1.5, label="median")
    for task in sorted(named & set(series)):
        pts = series[task]
        ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], color="#d62728", linewidth=1, label=task)


def histogram(values: Mapping[str, float], path: Path, named: Sequence[str] = (), title: str = "") -> Path:
    """How many workers take how long per step (their mean step time, ms), from zero; the named
    workers (the slowest, the stragglers) marked where they fall."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5), dpi=110)
    vals = list(values.values())
    if vals:
        ax.hist(vals, bins=min(60, max(10, len(vals) // 10)), range=(0, max(vals) * 1.05), color="#4e79a7")
    for task in named:
        if task in values:
            ax.axvline(values[task], color="#d62728", linestyle="--", linewidth=1)
            ax.annotate(
                task, (values[task], ax.get_ylim()[1]), rotation=90, va="top", ha="right", fontsize=8, color="#d62728"
            )
    ax.set_xlim(left=0)
    ax.set_xlabel("mean step time (ms)")
    ax.set_ylabel("workers")
    ax.set_title(
        (title or f"Step time of {len(vals)} workers") + (f"\n{_spread_note(vals)}" if vals else ""), fontsize=10
    )
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def time_split(per_worker: Mapping[str, Mapping[str, float]], path: Path, title: str = "Where a step goes") -> Path:
    """Stacked bars: each worker's (or size's) step split into its parts (ms), in the given order."""
    plt = _pyplot()
    tasks = list(per_worker)
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(tasks) + 3), 4), dpi=110)
    bottom = [0.0] * len(tasks)
    parts = [p for p in PART_COLORS if any(per_worker[t].get(p) for t in tasks)]
    for part in parts:
        values = [float(per_worker[t].get(part) or 0.0) for t in tasks]
        ax.bar(tasks, values, bottom=bottom, color=PART_COLORS[part], label=PART_LABELS[part])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if parts:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, plt, path)


def scaling(points: Sequence[Mapping[str, Any]], unit: str, path: Path) -> Path:
    """Throughput and efficiency against the number of workers, with the ideal line."""
    plt = _pyplot()
    pts = sorted((p for p in points if p.get("throughput")), key=lambda p: p["workers"])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if pts:
        ns = [p["workers"] for p in pts]
        base = pts[0]["throughput"] / pts[0]["workers"]
        ax.plot(ns, [p["throughput"] for p in pts], marker="o", label=f"measured {unit}")
        ax.plot(ns, [base * n for n in ns], linestyle="--", color="gray", label="ideal (linear)")
        ax.set_xticks(ns)
        ax2 = ax.twinx()
        ax2.plot(ns, [100 * (p.get("efficiency") or 0) for p in pts], marker="s", color="#e15759", label="efficiency")
        ax2.set_ylim(0, 110)
        ax2.set_ylabel("scaling efficiency (%)")
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
        ax.legend(lines, labels, fontsize=8, loc="upper left")
    ax.set_xlabel("workers")
    ax.set_ylabel(unit)
    ax.set_title("Throughput against workers")
    ax.grid(alpha=0.3)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    write_bytes_atomic(path, png.getvalue(), durable=False)
    return path


def html_page(title: str, summary: str, images: Sequence[tuple[str, Path]], tables: Sequence[str] = ()) -> str:
    """One self-contained page: the text summary, any preformatted tables, every PNG inlined."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:13px}img{max-width:100%}"
        "figure{margin:1.5em 0}figcaption{color:#555;font-size:14px}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<pre>{html.escape(summary)}</pre>",
    ]
    parts += [f"<pre>{html.escape(t)}</pre>" for t in tables]
    for caption, png in images:
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)
