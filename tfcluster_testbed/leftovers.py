"""What of a test bed is still there after it was used or stopped.

Tests and benchmarks call this after every test bed, so a launcher that leaks a process, a
connection or a namespace fails loudly instead of slowly filling the machine.
"""

from __future__ import annotations

import os

from . import base
from .bed import Testbed
from .procs import _describe, _lookup, _Scan, _self_and_ancestors
from .sshd import _is_sshd
from .waiting import wait_for


def leftovers(tb: Testbed, *, include_sessions: bool = False) -> list[str]:
    """What of the test bed is still there, one line each.

    Running test bed: processes on its hosts other than sshd itself (`include_sessions=True`
    also lists per-connection sshd processes, i.e. SSH connections still open). Stopped test bed:
    any process it signalled or started that is still alive, processes still carrying its env
    marker, its namespaces and its directory.
    """
    out: list[str] = []
    if tb.running:
        for name, procs in tb.processes_by_host().items():
            for p in procs:
                if include_sessions or not _is_sshd(p):
                    out.append(f"{name}: {_describe(p)}")
        return out
    st = tb._state
    recorded = list(tb.killed)
    if st is not None:
        recorded += [(pid, ct, "recorded") for pid, ct in st.listeners + st.roots + st.orphans]
    seen = set()
    for pid, ct, desc in recorded:
        if (pid, ct) in seen:
            continue
        seen.add((pid, ct))
        if (p := _lookup(pid, ct)) is not None:
            out.append(f"alive: {_describe(p)} ({desc})")
    protect = _self_and_ancestors()
    scan = _Scan(f"{tb.id}:")
    for pid, value in scan.marker.items():
        if pid not in protect and (pid, scan.procs[pid].create_time()) not in seen:
            out.append(f"alive with {base.MARKER_ENV}={value}: {_describe(scan.procs[pid])}")
    if st is not None:
        out += [f"namespace {n}" for n in st.netns if os.path.exists(f"/run/netns/{n}")]
        if os.path.exists(st.dir):
            out.append(f"directory {st.dir}")
    return out


def assert_no_leftovers(tb: Testbed, *, timeout: float = 5.0, include_sessions: bool = False) -> None:
    """Assert leftovers(tb) is empty, polling up to `timeout` (remote processes die asynchronously
    after a launcher stops them)."""
    found: list[str] = []

    def clean() -> bool:
        found[:] = leftovers(tb, include_sessions=include_sessions)
        return not found

    wait_for(clean, timeout, lambda: f"test bed {tb.id} to leave nothing behind; it left:\n  " + "\n  ".join(found))
