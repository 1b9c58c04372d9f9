"""Which live processes are "on" which test bed host.

Loopback hosts share one machine, so a process belongs to a host by ancestry (its sshd), by the
env marker that host's sshd sets (daemonized processes), by a recorded identity (orphans of
kill_sshd) or, in netns mode, by namespace membership. Tests and leftover checks rely on this
to see, and to end, exactly what a launcher started on each host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import psutil

from .base import TestHost
from .net import _netns_inode
from .procs import _alive, _Scan, _self_and_ancestors, _socket_inodes, _tcp_table
from .sshd import _Sshd


def _processes_by_host(
    tb_id: str,
    hosts: Sequence[TestHost],
    all_sshds: Sequence[_Sshd],
    sshd_of: Mapping[str, _Sshd],
    orphans: Mapping[str, Sequence[tuple[int, float]]],
    marker: Callable[[TestHost], str],
) -> dict[str, list[psutil.Process]]:
    """host name -> its live processes other than its listening sshd, from a single /proc scan.

    `all_sshds`/`sshd_of`: the test bed's sshds, and the one serving each host name; `orphans`:
    identities left behind by kill_sshd, by host name; `marker`: each host's env marker value.
    """
    inodes = {ino: h.netns for h in hosts if h.netns and (ino := _netns_inode(h.netns)) is not None}
    scan = _Scan(f"{tb_id}:", inodes)
    protect = _self_and_ancestors()
    out: dict[str, list[psutil.Process]] = {}
    conn_addr: dict[int, set[str]] = {}  # single_sshd: per-connection sshd -> local addresses
    for s in all_sshds:
        if len(s.hosts) > 1 and s.proc is not None and s.proc.pid in scan.procs:
            table = _tcp_table(s.proc.pid)
            for child in scan.children.get(s.proc.pid, ()):
                sock_inodes = _socket_inodes(child)
                conn_addr[child] = {table[i][0] for i in sock_inodes if i in table and table[i][2] != "0A"}
    for h in hosts:
        pids: set[int] = set()

        def add(pid: int, pids: set[int] = pids) -> None:
            pids.add(pid)
            pids.update(scan.descendants(pid))

        s = sshd_of.get(h.name)
        listener = s.proc if s is not None else None
        if s is not None and listener is not None and listener.pid in scan.procs and _alive(listener):
            if len(s.hosts) > 1:  # single_sshd: tell hosts apart by the connection's local address
                for child in scan.children.get(listener.pid, ()):
                    if h.address in conn_addr.get(child, ()):
                        add(child)
            else:
                pids.update(scan.descendants(listener.pid))
        for pid, ct in orphans.get(h.name, ()):
            if (p := scan.procs.get(pid)) is not None and abs(p.create_time() - ct) <= 0.01:
                add(pid)
        host_marker = marker(h)
        for pid, value in scan.marker.items():
            if value == host_marker:
                add(pid)
        for pid, ns in scan.netns.items():
            if ns == h.netns:
                add(pid)
        if listener is not None:
            pids.discard(listener.pid)
        pids -= protect
        out[h.name] = [scan.procs[p] for p in sorted(pids) if p in scan.procs and _alive(scan.procs[p])]
    return out
