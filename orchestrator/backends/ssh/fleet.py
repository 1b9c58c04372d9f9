"""The SSH backend: one paramiko connection per host, one exec channel per task and attempt."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from worker_entry.protocol import NodeConfig, command_line

from ...core.diagnostics import Diagnostic
from ...plan import NodePlan
from ..backend import PerTaskBackend
from ..base import Channel, ConnectFailure, Connection
from .connection import KeyCache, SshConnection


@dataclass(frozen=True)
class HostFailure:
    task: str
    host: str
    failure: ConnectFailure


def make_connection(node: NodePlan, keys: KeyCache) -> SshConnection:
    t = node.ssh
    if t is None:
        raise ConnectFailure("ssh", f"{node.task} has no SSH target (scheduler plan)")
    return SshConnection(
        hostname=t.hostname,
        port=t.port,
        user=t.user,
        identity_files=t.identity_files,
        known_hosts=t.known_hosts,
        connect_timeout_s=t.connect_timeout_s,
        keepalive_s=t.keepalive_s,
        proxy_command=t.proxy_command,
        label=t.label,
        keys=keys,
        jumps=t.jumps,
    )


def connect_all(
    nodes: Sequence[NodePlan], keys: KeyCache | None = None
) -> tuple[dict[str, Connection], list[HostFailure], float]:
    """(connections by task, failures, seconds). Hosts are independent: one slow host delays only itself."""
    keys = keys or KeyCache()
    t0 = time.monotonic()

    def one(node: NodePlan) -> tuple[NodePlan, Connection | None, ConnectFailure | None]:
        try:
            return node, make_connection(node, keys).connect(), None
        except ConnectFailure as exc:
            return node, None, exc
        except Exception as exc:  # anything unexpected is still per host, never a crash of the launch
            return node, None, ConnectFailure("ssh", f"{type(exc).__name__}: {exc}")

    conns: dict[str, Connection] = {}
    failures: list[HostFailure] = []
    if not nodes:
        return conns, failures, 0.0
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as pool:
        for node, conn, err in pool.map(one, nodes):
            if conn is not None:
                conns[str(node.task)] = conn
            else:
                assert err is not None
                failures.append(HostFailure(str(node.task), node.ssh.label if node.ssh else node.host, err))
    return conns, failures, time.monotonic() - t0


def close_all(conns: dict[str, Connection]) -> None:
    for c in conns.values():
        c.close()


class SshBackend(PerTaskBackend):
    """Tasks are started by the launcher over SSH: ``exec PYTHON -m worker_entry`` through the login
    shell (the line holds nothing but the quoted interpreter), the config on the channel's stdin."""

    name = "ssh"

    def __init__(self, keys: KeyCache | None = None) -> None:
        self.keys = keys or KeyCache()
        self.conns: dict[str, Connection] = {}
        self.hosts: dict[str, str] = {}  # each connected task's host: a reshaped plan moves a task to another
        self.connect_seconds = 0.0

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        todo = []
        for n in nodes:
            conn = self.conns.get(str(n.task))
            if conn is not None and conn.is_alive() and self.hosts.get(str(n.task)) == n.host:
                continue
            if conn is not None:
                self.conns.pop(str(n.task)).close()
            todo.append(n)
        conns, failures, self.connect_seconds = connect_all(todo, self.keys)
        self.conns.update(conns)
        self.hosts.update({str(n.task): n.host for n in todo if str(n.task) in conns})
        return [f.failure.diagnostic(f.task, f.host) for f in failures]

    def start(self, node: NodePlan, config: NodeConfig) -> Channel:
        conn = self.conns.get(str(node.task))
        if conn is None:
            raise OSError(f"not connected to {node.host}")
        chan = conn.exec(node.argv)
        try:
            chan.send(command_line(config))
        except OSError:
            chan.close()
            raise
        return chan

    def connection(self, task: str) -> Connection | None:
        return self.conns.get(task)

    def close(self) -> None:
        close_all(self.conns)
        self.conns = {}
