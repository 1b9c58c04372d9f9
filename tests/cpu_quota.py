"""A CPU cgroup quota on processes for the tests (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path


def cpu_cgroup() -> tuple[str, str] | None:
    """(version, parent) of a CPU cgroup hierarchy where we may create a child, else None."""
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") and os.access("/sys/fs/cgroup/cpu", os.W_OK):
        return "v1", "/sys/fs/cgroup/cpu"
    ctl = Path("/sys/fs/cgroup/cgroup.controllers")
    if ctl.exists() and "cpu" in ctl.read_text().split() and os.access("/sys/fs/cgroup", os.W_OK):
        return "v2", "/sys/fs/cgroup"
    return None


@contextlib.contextmanager
def cpu_quota(cpus: float, name: str) -> Iterator[Path]:
    """A child cgroup limited to ``cpus`` CPUs; yields its directory (write PIDs to its
    ``cgroup.procs``). On exit every process still in it goes back to the parent, then it is removed."""
    found = cpu_cgroup()
    if found is None:
        raise LookupError("no writable CPU cgroup (v1 cpu.cfs_quota_us or v2 cpu.max) on this machine")
    version, parent = found
    cg = Path(parent, f"{name}-{os.getpid()}")
    cg.mkdir()
    try:
        if version == "v1":
            (cg / "cpu.cfs_period_us").write_text("100000")
            (cg / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
        else:
            (cg / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
        yield cg
    finally:
        for _ in range(100):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    Path(parent, "cgroup.procs").write_text(pid)
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
