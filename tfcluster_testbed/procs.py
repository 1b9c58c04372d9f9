"""Process identity, /proc scans and ordered killing.

The test bed ends processes by recorded identity only (PID plus create time, never by name or
pattern), and kills leaves before their parents so every process is reaped instead of orphaned.
The TCP table helpers read /proc/PID/net/tcp, which sees inside namespaces the test bed cannot
connect to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import struct
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence

import psutil

from . import base

log = logging.getLogger(__name__)


def _ident(p: psutil.Process) -> tuple[int, float]:
    """(pid, create_time): identifies a process without the risk of PID reuse."""
    return (p.pid, p.create_time())


def _lookup(pid: int, ctime: float) -> psutil.Process | None:
    """The live (non-zombie) process recorded as (pid, ctime), or None."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - ctime) > 0.01 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _alive(p: psutil.Process) -> bool:
    """Running and not a zombie (PID 1 may never reap orphans, so zombies count as dead)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _describe(p: psutil.Process) -> str:
    """'pid N command' for logs and leftover reports; never raises (the process may be gone)."""
    try:
        # sshd rewrites its argv in place (setproctitle): drop the empty padding arguments.
        cmd = shlex.join([a for a in p.cmdline() if a]) or p.name()
    except (psutil.Error, OSError):
        cmd = "?"
    return f"pid {p.pid} {cmd[:160]}"


def _hex_addr(h: str) -> str:
    """Dotted IPv4 address of a /proc/net/tcp address field (hex, host byte order)."""
    return socket.inet_ntoa(struct.pack("<I", int(h, 16)))


def _socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process `pid` holds open (from its /proc fd links)."""
    inodes: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def _tcp_table(pid: int) -> dict[str, tuple[str, int, str]]:
    """inode -> (local address, local port, state hex) of the IPv4 TCP sockets in the network
    namespace of process `pid` (/proc/PID/net/tcp: lets the test bed see inside namespaces it
    cannot connect to)."""
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            lines = f.readlines()[1:]
    except OSError:
        return {}
    table = {}
    for line in lines:
        parts = line.split()
        if len(parts) > 9:
            addr, port = parts[1].split(":")
            table[parts[9]] = (_hex_addr(addr), int(port, 16), parts[3])
    return table


def _tcp_sockets(pid: int) -> list[tuple[str, int, str]]:
    """(local address, local port, state hex) of the IPv4 TCP sockets process `pid` holds."""
    table = _tcp_table(pid)
    return [table[i] for i in _socket_inodes(pid) if i in table]


def _self_and_ancestors() -> set[int]:
    """Our own PID and ancestors: never to be killed, whatever namespace or marker they carry."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


class _Scan:
    """One pass over /proc: parent links, test bed env markers and network namespaces."""

    def __init__(self, marker_prefix: str | None = None, netns_inodes: dict[int, str] | None = None):
        self.procs: dict[int, psutil.Process] = {}
        self.ppid: dict[int, int] = {}
        self.children: dict[int, list[int]] = defaultdict(list)
        self.marker: dict[int, str] = {}
        self.netns: dict[int, str] = {}
        needle = f"{base.MARKER_ENV}={marker_prefix}".encode() if marker_prefix else None
        for p in psutil.process_iter(["ppid", "status"]):
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.info["ppid"] is None:
                continue
            self.procs[p.pid] = p
            self.ppid[p.pid] = p.info["ppid"]
            self.children[p.info["ppid"]].append(p.pid)
            if needle is not None:
                self._read_marker(p.pid, needle)
            if netns_inodes:
                try:
                    ns = netns_inodes.get(os.stat(f"/proc/{p.pid}/ns/net").st_ino)
                except OSError:
                    ns = None
                if ns is not None:
                    self.netns[p.pid] = ns

    def _read_marker(self, pid: int, needle: bytes) -> None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            return
        if needle not in env:
            return
        for entry in env.split(b"\0"):
            if entry.startswith(needle):
                self.marker[pid] = entry.split(b"=", 1)[1].decode(errors="replace")
                return

    def descendants(self, pid: int) -> list[int]:
        """Every process below `pid` in this scan's parent links."""
        out, todo = [], list(self.children.get(pid, ()))
        while todo:
            c = todo.pop()
            if c in self.procs:
                out.append(c)
                todo.extend(self.children.get(c, ()))
        return out

    def depth_order(self, pids: Iterable[int]) -> list[list[int]]:
        """`pids` grouped by depth inside the set, deepest group first (kill leaves before parents,
        so every process is reaped by its still-living parent instead of becoming an orphan)."""
        pidset = set(pids)
        depth: dict[int, int] = {}
        for pid in pidset:
            d, cur, seen = 0, pid, set()
            while self.ppid.get(cur) in pidset and cur not in seen:
                seen.add(cur)
                cur = self.ppid[cur]
                d += 1
            depth[pid] = d
        groups: dict[int, list[int]] = defaultdict(list)
        for pid, d in depth.items():
            groups[d].append(pid)
        return [groups[d] for d in sorted(groups, reverse=True)]


def _wait_dead(procs: Sequence[psutil.Process], timeout: float, popens: Sequence[subprocess.Popen]) -> list:
    """Wait until every process is gone or a zombie; reap our own children on the way."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while True:
        for po in popens:
            po.poll()
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    """Send `sig` to each process, ignoring those already gone or out of reach."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            p.send_signal(sig)  # psutil checks (pid, create_time): no risk of hitting a reused PID


def _kill_ordered(
    scan: _Scan, pids: Iterable[int], grace: float, popens: Sequence[subprocess.Popen]
) -> list[tuple[int, float, str]]:
    """TERM, short grace, KILL — leaves first, then their parents, so each process is reaped by
    its parent. Returns (pid, create_time, description) of the processes signalled."""
    done: list[tuple[int, float, str]] = []
    for group in scan.depth_order(pids):
        procs = [scan.procs[pid] for pid in group if pid in scan.procs]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                done.append((p.pid, p.create_time(), _describe(p)))
        _signal(procs, signal.SIGTERM)
        survivors = _wait_dead(procs, grace, popens)
        if survivors:
            log.debug("SIGKILL after %.1fs grace: %s", grace, [_describe(p) for p in survivors])
            _signal(survivors, signal.SIGKILL)
            still = _wait_dead(survivors, 5.0, popens)
            if still:
                log.warning("processes survived SIGKILL: %s", [_describe(p) for p in still])
    return done
