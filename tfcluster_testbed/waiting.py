"""Waiting for a condition: the one polling loop of the test bed's users (the tests, the benchmarks).

It fails loudly: on a timeout it raises ``WaitTimeout`` (an AssertionError) saying what it waited
for, how long, and the last value the condition returned — never returns quietly, so a wait that
gave up is not mistaken for its condition (an empty list indexed later, a process that "exited").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

LAST_VALUE_CHARS = 600  # how much of the last value a timeout shows


class WaitTimeout(AssertionError):
    """A condition that did not hold in time."""


def wait_for(
    condition: Callable[[], T], timeout: float, message: str | Callable[[], str], *, interval: float = 0.1
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something true, and return that;
    after ``timeout`` seconds raise ``WaitTimeout`` naming ``message`` (what was awaited; a callable is
    asked then, to say what is known by then) and the last value seen. The condition is asked once more
    at the deadline: a slow last check still counts."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = repr(value)
            if len(seen) > LAST_VALUE_CHARS:
                seen = seen[:LAST_VALUE_CHARS] + "..."
            what = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what} (last value seen: {seen})")
        time.sleep(interval)
