"""Pictures of the training loss and the gradient noise scale (matplotlib through ``plots``): a run's
loss curve with B_simple over the same steps, and a sweep's loss per size against the examples seen.
Plain data in, a PNG out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .lossmodel import LossCurve, NoiseScale
from .plots import _pyplot, _save


def loss_and_noise(curve: LossCurve | None, noise: NoiseScale | None, path: Path) -> Path:
    """The loss against steps (top) and the smoothed B_simple with ± one standard error (bottom)."""
    plt = _pyplot()
    windows = [w for w in (noise.windows if noise else ()) if w.b_simple is not None and w.step]
    rows = 2 if windows else 1
    fig, axes = plt.subplots(rows, 1, figsize=(7, 3.2 * rows), dpi=110, sharex=True, squeeze=False)
    ax = axes[0][0]
    pts = curve.points if curve else ()
    if pts:
        ax.plot([p.step for p in pts], [p.loss for p in pts], color="#4e79a7", label="training loss")
    ax.set_ylabel("loss (mean per interval)")
    ax.set_title("Training loss" + (" and the gradient noise scale" if windows else ""))
    ax.grid(alpha=0.3)
    if windows:
        bx = axes[1][0]
        xs = [w.step for w in windows]
        ys = [w.b_simple for w in windows]
        se = [w.stderr or 0.0 for w in windows]
        bx.plot(xs, ys, color="#e15759", marker=".", label="B_simple (smoothed)")
        bx.fill_between(
            xs,
            [y - e for y, e in zip(ys, se, strict=True)],
            [y + e for y, e in zip(ys, se, strict=True)],
            color="#e15759",
            alpha=0.2,
            label="± 1 standard error",
        )
        gb = noise.global_batch if noise else None
        if gb:
            bx.axhline(gb, color="gray", linestyle="--", label=f"global batch {gb:.0f}")
        bx.set_ylim(bottom=0)
        bx.set_ylabel("examples")
        bx.legend(fontsize=8, loc="upper left")
        bx.grid(alpha=0.3)
    axes[-1][0].set_xlabel("training step")
    return _save(fig, plt, path)


def loss_by_size(sizes: Sequence[Mapping[str, Any]], path: Path, target: float | None = None) -> Path:
    """Each size's loss against the examples it trained on (the same examples: statistical efficiency)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for s in sizes:
        pts = [p for p in ((s.get("loss") or {}).get("points") or []) if p.get("examples") is not None]
        if pts:
            ax.plot([p["examples"] for p in pts], [p["loss"] for p in pts], label=f"{s['workers']} workers")
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("examples trained on")
    ax.set_ylabel("training loss")
    ax.set_title("Loss against examples per size (the same line: perfect statistical efficiency)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)
