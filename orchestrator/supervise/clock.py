"""A node's timestamps on the launcher's clock.

Each node stamps its heartbeats, progress and profile records with its own clock. Whole-run rates are
computed over the window every task was training in (``figures``), so one host an hour off used to
leave no common window at all: every task's and the job's steps/s and examples/s were None in status,
report, goodput and TensorBoard. The launcher measures each node's skew at its hello (``session``:
the node's time against the midpoint of sending its config and reading its answer); beyond
``checks.CLOCK_SKEW_WARN_S`` (where preflight also warns) the node's records are shifted by it before
they are written to heartbeats.jsonl and fed to the figures, so every reader of the file sees the
same, corrected times (``clock_skew_s`` in the record says by how much). Within it, records stay as
the node stamped them: the measurement itself is only that good.
"""

from __future__ import annotations

from typing import Any

from .checks import CLOCK_SKEW_WARN_S


def on_launcher_clock(record: dict[str, Any], session: Any) -> dict[str, Any]:
    """``record`` (a heartbeat or profile of ``session``'s task, as written to heartbeats.jsonl) with its
    times corrected (only where the channel's hello measured the skew: not a pod's)."""
    skew_s = session.skew_s if getattr(session.channel, "times_hello", False) else None
    if skew_s is None or abs(skew_s) <= CLOCK_SKEW_WARN_S:
        return record
    out = dict(record)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = round(out["ts"] - skew_s, 6)
    progress = out.get("progress")
    if isinstance(progress, dict) and isinstance(progress.get("ts"), (int, float)):
        out["progress"] = {**progress, "ts": round(progress["ts"] - skew_s, 6)}
    out["clock_skew_s"] = round(skew_s, 3)
    return out
