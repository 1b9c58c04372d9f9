"""The tests' one way to wait: ``wait_for(condition, timeout, message)``, polling until the condition
holds and failing the test loudly (``pytest.fail``: what it waited for, how long, the last value seen)
when it does not in time. The loop is the test bed's (``tfcluster_testbed.waiting``), shared with the
benchmarks; a test waits for the very condition it then asserts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from tfcluster_testbed.waiting import WaitTimeout
from tfcluster_testbed.waiting import wait_for as _poll

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], timeout: float, message: str | Callable[[], str], *, interval: float = 0.1
) -> T:
    try:
        return _poll(condition, timeout, message, interval=interval)
    except WaitTimeout as exc:
        why = str(exc)
    pytest.fail(why)


def returns_within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``'s value, failing the test (not hanging the suite) when it has not returned within
    ``seconds``: for what must not block (a FIFO planted where a file was expected). The call runs on a
    daemon thread, left behind only when the test fails."""
    import threading

    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{fn} still blocked after {seconds} s")
    return out[0]
