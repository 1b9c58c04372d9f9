"""The console's view of every task's lines: what every rank says once, TensorFlow's chatter hidden.

At 64 workers TensorFlow's start-up banner is 256 identical console lines, and a ParameterServerStrategy
job streams the same warning from every worker each step. ``ConsoleLines`` holds each line up to
``WINDOW_S``; the same line from other tasks within that window joins it, and it is shown once with the
set of its tasks in a compact range notation, by role: ``[worker:0-63] oneDNN custom operations …``
(``[chief:0 worker:0-2,5] …``). A line that no other task repeated is shown as before, with its own
``[task host]`` prefix. Only the console collapses: the per-task logs and combined.log keep every line
(``LogRouter`` writes them before handing the line here).

The rules:

- *Same line*: the bytes as the terminal shows them, glog's header (level, time, thread id) aside, so
  ``W0000 00:00:17…  31791 dataset.cc:997] …`` from three processes is one line; the first task's text
  is shown.
- *Order*: each task's lines keep their order on the console. A task joins a held line only if it comes
  after every line of that task still held (held lines are shown in the order they arrived).
- *Delay*: a line is shown ``WINDOW_S`` after it arrived (plus the supervisor's flush tick, 0.1 s), never
  later; ``close`` shows everything held (the run's end). At most ``MAX_HELD`` lines are held: past that
  the oldest are shown at once (a flood costs no memory and flows).
- *Noise*: TensorFlow's known chatter (``sinks.noise``) is not shown unless ``show_noise``; the first time
  a line is hidden the console says so once, and how to see everything (``--all-output``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .noise import is_noise, strip_glog

WINDOW_S = 1.0  # TF's banner from 3 workers on a loaded host arrived over ~0.9 s (docs/benchmarks.md)
MAX_HELD = 4096
NOISE_NOTE = (
    b"tfcluster: TensorFlow's known start-up chatter is hidden on the console (the logs keep every line; "
    b"--all-output shows it)\n"
)


@dataclass
class _Held:
    seq: int
    key: bytes
    text: bytes  # the first task's line as shown, no newline
    tag: bytes  # the first task's console prefix
    since: float
    tasks: list[str] = field(default_factory=list)


class ConsoleLines:
    """Collapse identical lines of several tasks into one console line; hide known noise (see module)."""

    def __init__(
        self,
        write: Callable[[bytes], None],
        *,
        collapse: bool = True,
        show_noise: bool = False,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write
        self.collapse = collapse
        self.show_noise = show_noise
        self.window_s = window_s
        self.clock = clock
        self.hidden = 0  # lines of noise not shown
        self._held: OrderedDict[int, _Held] = OrderedDict()  # seq -> line, in arrival order (O(1) from the front)
        self._by_key: dict[bytes, deque[_Held]] = {}  # a text's held lines, oldest first
        self._last: dict[str, int] = {}  # task -> seq of its newest held line
        self._seq = 0

    def add(self, task: str, tag: bytes, lines: list[bytes]) -> None:
        """Lines of one task as shown (safe, without newlines), ``tag`` its console prefix."""
        now = self.clock()
        for line in lines:
            if not self.show_noise and is_noise(line):
                if not self.hidden:
                    self.write(NOISE_NOTE)
                self.hidden += 1
                continue
            if not self.collapse:
                self.write(tag + line + b"\n")
                continue
            self._hold(task, tag, line, now)
        if len(self._held) > MAX_HELD:
            self._show(len(self._held) - MAX_HELD)

    def _hold(self, task: str, tag: bytes, line: bytes, now: float) -> None:
        key = strip_glog(line)
        after = self._last.get(task, -1)
        for held in self._by_key.get(key, ()):
            if held.seq > after:  # joins it: the task has no line held after this one
                held.tasks.append(task)
                self._last[task] = held.seq
                return
        self._seq += 1
        held = _Held(self._seq, key, line, tag, now, [task])
        self._held[held.seq] = held
        self._by_key.setdefault(key, deque()).append(held)
        self._last[task] = held.seq

    def flush(self) -> None:
        """Show every line held for its window."""
        cutoff = self.clock() - self.window_s
        due = 0
        for held in self._held.values():
            if held.since > cutoff:
                break
            due += 1
        self._show(due)

    def close(self) -> None:
        """Show everything held (the run's end, or the console going away)."""
        self._show(len(self._held))

    def _show(self, count: int) -> None:
        """Show the ``count`` oldest held lines (each is the oldest of its text's)."""
        for _ in range(min(count, len(self._held))):
            _, held = self._held.popitem(last=False)
            same = self._by_key[held.key]
            same.popleft()
            if not same:
                del self._by_key[held.key]
            tag = held.tag if len(held.tasks) == 1 else b"[" + task_ranges(held.tasks).encode() + b"] "
            self.write(tag + held.text + b"\n")


def task_ranges(tasks: list[str]) -> str:
    """``worker:0 worker:1 worker:2 worker:5 chief:0`` → ``chief:0 worker:0-2,5``: by role (the chief's,
    then the others by name), each role's indices as ranges. A name not ``role:index`` is listed as is."""
    by_role: dict[str, set[int]] = {}
    other: list[str] = []
    for task in tasks:
        role, _, index = task.partition(":")
        if index.isdigit():
            by_role.setdefault(role, set()).add(int(index))
        else:
            other.append(task)
    parts = []
    for role in sorted(by_role, key=lambda r: (r != "chief", r)):
        parts.append(f"{role}:{_ranges(sorted(by_role[role]))}")
    return " ".join(parts + sorted(set(other)))


def _ranges(indices: list[int]) -> str:
    """Sorted indices as ``0-2,5``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
