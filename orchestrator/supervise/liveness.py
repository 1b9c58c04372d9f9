"""A task's watch, and the monitor's liveness verdicts (lost, hung, stalled) from it (the startup verdict:
``startup.py``). Pure.

``Monitor.check`` runs at the decision loop's 10 Hz. Scanning every task's watch each time was the
monitor's largest cost at 4,096 tasks (two dict comprehensions and a loop over every task, 40,000 a
second), though almost every scan found nothing: a verdict needs a task silent for the whole heartbeat
timeout, or no step for the whole progress timeout. ``Floors`` keeps a lower bound of every such
clock (the oldest heartbeat, the oldest step change, the newest step change), kept up to date on each
observation at the cost of a comparison; ``check`` scans every task only when a bound says a verdict
may be due, and the scan is the one it always was (the same verdicts, in the same order, at the same
tick: the FakeClock tests hold it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .verdicts import Verdict

EVIDENCE_BEATS = 3  # heartbeats of host evidence a round looks at

STOPPED_STATES = frozenset({"stopped", "tracing-stop"})


@dataclass(slots=True)
class Watch:
    last_seen: float
    proc_state: str | None = None
    stopped_since: float | None = None
    started: bool = False
    busy_at: float | None = None  # its last heartbeat with a busy process (startup.BUSY_PCT)
    steps: int | None = None
    steps_changed_at: float | None = None
    profile: dict[str, Any] | None = None
    profile_round: int = -1
    hosts: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_BEATS))
    slow_rounds: int = 0
    done: bool = False
    reported: set[str] = field(default_factory=set)


class Floors:
    """Bounds on the watches' clocks, so a tick that can find nothing scans nothing.

    ``seen``: at most every live task's ``last_seen`` (a lost verdict needs ``now - last_seen`` past the
    timeout: none can be due while ``now - seen`` is within it). ``changed``: at most every live member's
    ``steps_changed_at`` (a hung member needs its own past the progress timeout); ``newest``: at most the
    newest of them (a stall needs the newest past it). An observation keeps them bounds (a heartbeat can
    lower ``seen``, a step lower ``changed`` and raise ``newest`` to its time); a scan sets them exactly.
    A task that ends or is revived can take the newest step change with it: ``exact`` is cleared and
    the next tick scans."""

    __slots__ = ("changed", "exact", "newest", "seen")

    def __init__(self, now: float) -> None:
        self.seen = now
        self.changed = math.inf
        self.newest = -math.inf
        self.exact = False

    def rescan(self, watch: dict[str, Watch], members: set[str]) -> None:
        """The bounds, exactly, from every live watch (after a full scan)."""
        seen = changed = math.inf
        newest = -math.inf
        for t, w in watch.items():
            if w.done:
                continue
            if "lost" not in w.reported and w.last_seen < seen:
                seen = w.last_seen
            at = w.steps_changed_at
            if at is not None and t in members:
                if at > newest:
                    newest = at
                if "hung" not in w.reported and at < changed:
                    changed = at
        self.seen, self.changed, self.newest, self.exact = seen, changed, newest, True


def lost(task: str, silent: float, timeout_s: float) -> Verdict:
    return Verdict(
        "lost",
        task,
        f"no heartbeat for {silent:.1f}s (timeout {timeout_s:g}s): process, host or network gone",
        fatal=True,
        data={"silent_s": round(silent, 2)},
    )


def hung(task: str, w: Watch, now: float) -> Verdict:
    assert w.stopped_since is not None
    return Verdict(
        "hung",
        task,
        f"training process stopped (state {w.proc_state}, e.g. SIGSTOP) for "
        f"{now - w.stopped_since:.1f}s; every peer waits for it in the next all-reduce",
        fatal=True,
        data={"state": w.proc_state, "stopped_s": round(now - w.stopped_since, 2)},
    )


def progress_verdicts(now: float, live: dict[str, Watch], limit: float) -> list[Verdict]:
    """Stalled (no step on any member for ``limit``) or hung (one member without a step for ``limit``
    while the others are ahead of it), from the live members' watches."""
    stepping = {t: w for t, w in live.items() if w.steps_changed_at is not None}
    if not stepping:
        return []
    newest = max(w.steps_changed_at for w in stepping.values())  # type: ignore[type-var]
    out = []
    if now - newest > limit:
        if "stalled" not in next(iter(stepping.values())).reported:
            for w in stepping.values():
                w.reported.add("stalled")
            laggard = min(stepping, key=lambda t: stepping[t].steps or 0)
            distinct = len({w.steps for w in stepping.values()}) > 1
            out.append(
                Verdict(
                    "stalled",
                    laggard if distinct else None,
                    f"no training step on any worker for {now - newest:.0f}s (progress_timeout_s {limit:g}): "
                    "a collective is wedged or the job is stuck",
                    fatal=True,
                    data={"steps": {t: w.steps for t, w in stepping.items()}},
                )
            )
        return out
    most = max(w.steps or 0 for w in stepping.values())
    for t, w in stepping.items():
        # "while others progress": they must be ahead of it, not just heard from a few ms later
        # (every worker stops at the same step when one hangs inside the loop)
        behind = (w.steps or 0) < most
        if behind and now - w.steps_changed_at > limit and "hung" not in w.reported:  # type: ignore[operator]
            w.reported.add("hung")
            out.append(
                Verdict(
                    "hung",
                    t,
                    f"no training progress for {now - w.steps_changed_at:.0f}s while other workers progress",  # type: ignore[operator]
                    fatal=True,
                    data={"steps": w.steps},
                )
            )
    return out
