"""The launcher's pings: as few as a node's patience allows, spread over time, not sent in bursts.

A node's worker_entry stops its task when it has heard nothing from the launcher for its
``launcher_timeout_s`` (``plan.Runtime``: a little under the launcher's heartbeat timeout, 9 s by
default); any command counts. A ping per task every heartbeat interval (1,024 sealed frames a second at
1,024 tasks) was 6 % of the launcher's CPU for nothing: a task is pinged every ``period`` = a third of
its patience (three chances in every window, however late one is), never more often than every
heartbeat interval, as before. The tasks are pinged round-robin, a share of them at each tick of the
loop, so 4,096 sealed frames never go out in one burst that would stall the decision loop.

A task that ended is pinged too while its node waits for the hand-over (``task_files`` sent, channel
open): a chief that finished 13 s before the last worker would otherwise give up on the silent launcher
and close its channel, and its checkpoint would not be handed over at the attempt's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker_entry import protocol as p

from .session import TaskSession


class _Ping(p.Ping):
    """``p.Ping()`` with its line encoded once (``frames.command_line`` takes a command's ``to_line``):
    ~1,400 pings a second at 4,096 tasks were as many ``json.dumps`` of the same two fields."""

    _line = p.command_line(p.Ping())

    def to_line(self) -> bytes:
        return self._line


def ping_period(interval_s: float, launcher_timeout_s: float) -> float:
    """Seconds between two pings to one task: a third of the node's patience, at least an interval."""
    return max(interval_s, launcher_timeout_s / 3.0)


class Pings:
    def __init__(self, tasks: Sequence[str], period_s: float, now: float) -> None:
        self.tasks = list(tasks)
        self.period_s = period_s
        self._next = 0  # the next task in the round
        self._owed = 0.0  # pings the time since the last tick has earned
        self._last = now
        self._ping = _Ping()

    def tick(self, now: float, sessions: Mapping[str, TaskSession]) -> int:
        """Ping the tasks whose turn came since the last tick (every task once a ``period_s``; a loop
        that stalled catches up with one round at most); how many pings went out."""
        n = len(self.tasks)
        if n == 0:
            return 0
        self._owed = min(float(n), self._owed + n * max(0.0, now - self._last) / self.period_s)
        self._last = now
        due = int(self._owed)
        self._owed -= due
        sent = 0
        for _ in range(due):
            s = sessions[self.tasks[self._next]]
            self._next = (self._next + 1) % n
            if (s.state.is_alive or s.handing_over) and s.send(self._ping):
                sent += 1
        return sent
