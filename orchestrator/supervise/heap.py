"""The launcher's heap while it supervises: the objects built before the first attempt (the modules,
the plan, the spec, the sinks, a continued run's figures) frozen out of the cyclic collector, and a
larger first generation.

At 1,024 load-generator tasks the cyclic collector took 0.37 s of CPU in 20 s of steady state
(~110 young collections, ten of the middle generation and one full one over every object the launcher
holds: ~2 % of a core, docs/benchmarks.md §11); with the heap frozen after the start and 20,000
allocations between young collections, 0.05 s. Nothing frozen needs the collector (it lives until the
job ends); cycles made while supervising are still collected, only
less often. Undone when the job's attempts end (``gc.unfreeze``: a process that runs many jobs, the
tests, gets its collector back as it was), and nested uses undo only at the outermost.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

YOUNG = 20_000  # allocations between two young collections (CPython's default: 700)

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, ...] = ()


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """While the attempts run: what exists now frozen, young collections rarer; then as before."""
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth == 1:
            _saved = gc.get_threshold()
            gc.collect()  # the start's garbage first: only live objects are frozen
            gc.freeze()
            gc.set_threshold(max(YOUNG, _saved[0]), *_saved[1:])
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                gc.unfreeze()
