"""Connect to every node of a plan in parallel; report every failure at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .plan import NodePlan, Plan
from .transport import ConnectFailure, Connection
from .transport.ssh import KeyCache, SshConnection


@dataclass(frozen=True)
class HostFailure:
    task: str
    host: str
    failure: ConnectFailure


def make_connection(node: NodePlan, keys: KeyCache) -> SshConnection:
    t = node.ssh
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
    )


def connect_all(
    nodes: list[NodePlan] | tuple[NodePlan, ...], keys: KeyCache | None = None
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
                failures.append(HostFailure(str(node.task), node.ssh.label, err))
    return conns, failures, time.monotonic() - t0


def close_all(conns: dict[str, Connection]) -> None:
    for c in conns.values():
        c.close()


def plan_nodes(plan: Plan, tasks: list[str] | None = None) -> list[NodePlan]:
    return [n for n in plan.nodes if tasks is None or str(n.task) in tasks]
