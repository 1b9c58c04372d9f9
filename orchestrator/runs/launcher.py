"""launcher.json: who supervises a run (pid, start time, host, argv), so ``status`` can tell a live launcher
from a recycled pid and ``stop`` signals only that process."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import Any

from ..core.redact import redact_argv


def launcher_info(**extra: Any) -> dict[str, Any]:
    """This process as launcher.json records it (argv redacted)."""
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "hostname": socket.gethostname(),
        "argv": redact_argv(sys.argv),
        "started": time.time(),
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        info["create_time"] = process_start_time(os.getpid())
    return {**info, **extra}


def process_start_time(pid: int) -> float:
    """When ``pid`` started, in seconds since the epoch, as psutil's ``create_time()`` computes it
    (``tfcluster stop`` compares the two): /proc/PID/stat's start time in clock ticks after boot, plus
    the boot time. Read directly: importing psutil costs the launcher's start ~70 M instructions."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm)": state is field 3
    ticks = int(fields[19])  # field 22: starttime
    with open("/proc/stat", "rb") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
    return ticks / os.sysconf("SC_CLK_TCK") + boot
