"""The startup deadline's verdict: the tasks that did not start in time, and which of them to blame.

MWMS waits forever in the strategy constructor for a task that never starts, so at the deadline the job
is stopped. On a loaded box a healthy task may still be importing TensorFlow then: its process keeps a
CPU busy. A task that will never start (asleep, blocked on a lock, a mount, a peer) does not. Naming the
first late task in plan order blamed a busy worker:0 for an idle worker:2 (test_launch_e2e at load 14),
so the idle ones are named and the root cause, and the busy ones are listed after them as slow, not
stuck. Without process samples (no psutil on the node) every late task counts as idle: plan order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .verdicts import Policy, Verdict

BUSY_PCT = 5.0  # a heartbeat's process CPU at or above this: the task is working its way to a start


def busy_window_s(policy: Policy) -> float:
    """How recent a busy heartbeat must be to count (a few beats: one starved interval is not idle)."""
    return max(5.0, 5.0 * policy.interval_s)


def startup_verdict(late: Sequence[str], busy_at: Mapping[str, float | None], now: float, policy: Policy) -> Verdict:
    """The verdict on the members in ``late`` (in plan order); ``busy_at``: when each last sent a busy
    heartbeat (None: never)."""
    window = busy_window_s(policy)
    busy, idle = [], []
    for t in late:  # one pass, plan order kept in each (a membership test against the busy list was O(n²))
        (busy if (at := busy_at.get(t)) is not None and now - at <= window else idle).append(t)
    named = idle or list(late)
    msg = (
        f"{', '.join(named)} did not start within {policy.startup_timeout_s:g}s (no TF server, strategy or "
        "training step); MWMS would wait for it forever"
    )
    if idle and busy:
        msg += f"; {', '.join(busy)} had not started either but kept a CPU busy (slow to start, not stuck)"
    return Verdict(
        "startup_timeout", named[0], msg, fatal=True, data={"not_started": [*named, *busy] if idle else named}
    )
