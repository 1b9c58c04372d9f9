"""Signals on the launcher: SIGINT/SIGTERM/SIGHUP mean "tear the job down cleanly, then exit"."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from ..supervise import Interrupt

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_to(interrupt: Interrupt) -> Iterator[None]:
    """Route HANDLED signals to ``interrupt`` for the duration of the block."""
    previous = {s: signal.signal(s, lambda signum, frame: interrupt.trigger(signum)) for s in HANDLED}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
