"""Fault injection on one test-bed host, for the ``Testbed`` methods of the same names: its sshd
killed (the users' processes it served keep running, still tracked) and started again, its link cut
and restored, what it sends rate-limited (the last two in netns mode: loopback hosts share one stack).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import psutil

from .base import TestbedError, TestHost
from .net import _run, tbf_argv
from .procs import _alive, _ident
from .sshd import _kill_tree, _listener_alive, _split_tree, _Sshd, _Sshds


def kill_sshd(s: _Sshd, orphans: list[tuple[int, float]], record: Callable[[], None]) -> list[psutil.Process]:
    """SIGKILL ``s`` (the host's listening sshd) and its per-connection sshd processes; the user
    processes it served join ``orphans``, which ``record`` saves before the kill (so stop() and
    reap_stale() still find them). The user processes left running."""
    if not _listener_alive(s):
        return []
    scan, sshd_pids, user = _split_tree(s)
    for pid in user:
        with contextlib.suppress(psutil.Error):
            orphans.append(_ident(scan.procs[pid]))
    record()
    _kill_tree(scan, sshd_pids, s)
    return [scan.procs[p] for p in user if _alive(scan.procs[p])]


def restart_sshd(fleet: _Sshds, s: _Sshd) -> bool:
    """Start ``s`` again (same address, port and host key) unless it runs; whether it was started."""
    if _listener_alive(s):
        return False
    fleet.spawn(s)
    fleet.wait_listening([s], retries=0)
    return True


def set_link(h: TestHost, state: str) -> None:
    """The host's eth0 ``up`` or ``down`` (down: packets to and from it are dropped silently)."""
    if h.netns is None:
        raise TestbedError("cut()/restore() need netns mode (loopback hosts share one stack)")
    _run(["ip", "-n", h.netns, "link", "set", "eth0", state])


def rate_limit(h: TestHost, rate: str | None, burst: str, latency: str) -> None:
    """``tc tbf`` on the host side of its veth, in its namespace (``rate`` None: removed)."""
    if h.netns is None:
        raise TestbedError("rate_limit() needs netns mode (loopback hosts share one stack)")
    _run(tbf_argv(h.netns, rate, burst, latency))
