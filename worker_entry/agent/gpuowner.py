"""Whose is a process on a GPU: the task's own tree, another program's, or one this node cannot see.

NVML lists every compute process on a GPU by PID. A process outside the task's tree on a GPU the task
uses is a real straggler cause (measured on an H100: two matmul processes on one GPU each ran at 0.48x
the throughput of one alone) — typically a leftover of an earlier job. worker_entry knows its tree:
itself, the training process, and everything that descends from it or stays in its session.

PID namespaces: NVML gives PIDs as the driver knows them (the host's namespace). Inside a container
worker_entry sees its own namespace, so a listed PID may not exist here, or — rarely — name another
process here. A PID that does not exist in this namespace is "elsewhere": it cannot be placed (it may
even be this task's own process under its host PID), and is reported as such.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The initial PID namespace's inode (PROC_PID_INIT_INO in the kernel): any other means a container.
INIT_PID_NS = 0xEFFFFFFC
MAX_DEPTH = 64  # parent links walked per PID


def in_container_pid_ns(proc: Path = Path("/proc")) -> bool:
    """True when this process runs in a PID namespace other than the host's (a container)."""
    try:
        return os.readlink(proc / "self" / "ns" / "pid") != f"pid:[{INIT_PID_NS}]"
    except OSError:
        return False


def _stat(proc: Path, pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, session) of a process, or None when unreadable."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    left, right = raw.find("("), raw.rfind(")")
    fields = raw[right + 2 :].split()
    if left < 0 or right < 0 or len(fields) < 4:
        return None
    return raw[left + 1 : right], int(fields[1]), int(fields[3])


class TaskTree:
    """``owner(pid)`` for ``Nvml.sample``: the task's processes are ``roots`` (worker_entry, the
    training process), their descendants, and anything still in the training process's session."""

    def __init__(self, *roots: int, proc: Path = Path("/proc")) -> None:
        self.roots = {r for r in roots if r > 0}
        self.proc = proc
        self.nested = in_container_pid_ns(proc)
        self.sessions = {s for r in self.roots if (st := _stat(proc, r)) is not None and (s := st[2]) > 0}
        self.sessions.discard(os.getsid(0))  # worker_entry's own session is the login's: not only ours

    def __call__(self, pid: int) -> tuple[str, str | None]:
        if pid in self.roots:
            return "task", None
        if pid <= 0:  # some drivers list 0 for a process they cannot map into this namespace
            return ("elsewhere" if self.nested else "gone"), None
        st = _stat(self.proc, pid)
        if st is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return ("elsewhere" if self.nested else "gone"), None
            except (PermissionError, OSError):
                return "other", None  # there, but not ours to read (another user's)
            return "other", None
        name, ppid, session = st
        if session in self.sessions:
            return "task", name
        seen = 0
        while ppid > 1 and seen < MAX_DEPTH:
            if ppid in self.roots:
                return "task", name
            parent = _stat(self.proc, ppid)
            if parent is None:
                break
            ppid = parent[1]
            seen += 1
        return "other", name
