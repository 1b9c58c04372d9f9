"""Channels that closed before their task's end was known: awaited by the decision loop, not slept on.

A node's channel can end (EOF) a moment before its exit status arrives — and the status says why a
task is lost (the interpreter missing: 127). The loop keeps such tasks here, in the order their
channels closed, and looks again on each pass: a task is decided once its status came, once it was
told to stop (a stopped task needs none), or after ``EOF_STATUS_S``. The loop decides nothing else
while one is awaited, and before a decision that an input asks for (an exit, a protocol error, a
verdict) it settles every one now: what closed first is decided first, as if it had been decided on
arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .session import TaskSession

EOF_STATUS_S = 0.2  # a channel closed without an exit: how long its exit status may take to follow it
EOF_POLL_S = 0.01  # how often the loop looks for it meanwhile


class ClosedChannels:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._until: dict[str, tuple[TaskSession, float]] = {}  # channel key -> (its task, until when)
        self._busy = False  # one of them is being decided

    def __bool__(self) -> bool:
        return bool(self._until)

    def add(self, s: TaskSession) -> None:
        """``s``'s channel ended and its task is not terminal."""
        self._until[s.key] = (s, self.clock() + EOF_STATUS_S)

    def due(
        self, stopped: Callable[[TaskSession], bool], now: float | None = None
    ) -> Iterator[tuple[TaskSession, bool, int | None]]:
        """The tasks to decide now, in order, each with whether it counts as stopped (``stopped``: asked
        when its turn comes, after the decisions about those before it) and its exit status: up to the
        first still awaited (every one when ``now`` is None). Nothing while one of them is being
        decided: the others wait their turn."""
        if self._busy:
            return
        self._busy = True
        try:
            for key in list(self._until):
                s, until = self._until[key]
                is_stopped = stopped(s)
                status = s.channel.exit_status() if s.channel else None
                undecided = not is_stopped and not s.state.is_terminal and status is None
                if undecided and now is not None and now < until:
                    return  # its status may still come: the later ones wait behind it
                del self._until[key]
                yield s, is_stopped, status
        finally:
            self._busy = False
