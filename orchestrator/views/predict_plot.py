"""`tfcluster predict --png/--html`: the predicted curve beside the points a `scale` sweep measured.

matplotlib through ``plots`` (Agg, optional dependency); the page is ``plots.html_page``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..runs import write_bytes_atomic
from .plots import _pyplot, _save, html_page


def curve(pred: Mapping[str, Any], path: Path) -> Path:
    """Left: step time (ms) stacked into own work / wait / all-reduce against workers, measured step
    times as points; right: efficiency (%), predicted line and measured points."""
    plt = _pyplot()
    sizes = sorted(pred["sizes"], key=lambda s: s["workers"])
    ns = [s["workers"] for s in sizes]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    own = [s["own_ms"] for s in sizes]
    wait = [s["waiting_for_slowest_ms"] for s in sizes]
    ar = [s["allreduce_ms"] for s in sizes]
    ax.stackplot(
        ns,
        own,
        wait,
        ar,
        labels=["own work", "waiting for the slowest", "all-reduce"],
        colors=["#59a14f", "#f28e2b", "#e15759"],
        alpha=0.8,
    )
    meas = [(s["workers"], s["measured_step_ms"]) for s in sizes if s.get("measured_step_ms")]
    if meas:
        ax.plot([n for n, _ in meas], [v for _, v in meas], "ko", label="measured step")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("workers")
    ax.set_ylabel("ms per step")
    ax.set_title("Predicted step time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax2.plot(ns, [100 * (s["efficiency"] or 0) for s in sizes], marker="s", color="#e15759", label="predicted")
    effs = [(s["workers"], s["measured_efficiency"]) for s in sizes if s.get("measured_efficiency") is not None]
    if effs:
        ax2.plot([n for n, _ in effs], [100 * v for _, v in effs], "ko", label="measured")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(ns, [str(n) for n in ns])
    ax2.set_ylim(0, 105)
    ax2.set_xlabel("workers")
    ax2.set_ylabel("scaling efficiency (%)")
    ax2.set_title("Efficiency against one worker")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    return _save(fig, plt, path)


def page(pred: Mapping[str, Any], text: str, path: Path) -> tuple[Path, Path]:
    """The curve as a PNG beside ``path`` and a self-contained HTML page around it."""
    png = curve(pred, path.with_suffix(".png"))
    write_bytes_atomic(path, html_page("tfcluster predict", text, [("predicted scaling", png)]).encode(), durable=False)
    return path, png
