"""Where a node says its TF server listens (``hello.tf_endpoint``), held to where the node is.

A task restarted in place under Slurm gets a TF_CONFIG rebuilt from the endpoints its peers reported
in their hellos (``rolecare``). A node may lie: an endpoint naming another machine would send the
restarted task's collectives there. So an endpoint counts only when its host is the address the node's
connect-back connection came from (TCP says where it is, not the node) or a name that resolves to it.
An SSH channel carries no such address: its tasks' TF_CONFIG comes from the plan, not from the nodes.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any


def _ip(text: str) -> str | None:
    try:
        addr = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def endpoint_problem(endpoint: str, channel: Any) -> str | None:
    """Why ``endpoint`` (HOST:PORT, as a node reported it) is not an address of the node on the other
    end of ``channel`` (None: it is, or the channel cannot say where its node is)."""
    peer = getattr(channel, "peer", None)
    if not isinstance(peer, str) or not peer:
        return None
    peer_ip = _ip(peer.rpartition(":")[0])
    host = endpoint.rpartition(":")[0].strip("[]")
    if peer_ip is None or not host:
        return None if peer_ip is None else f"its node reported no host in its TF endpoint {endpoint!r}"
    ip = _ip(host)
    if ip is not None:
        ours = ip == peer_ip
    else:
        try:
            ours = peer_ip in {_ip(str(ai[4][0])) for ai in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
        except OSError:
            ours = False
    if ours:
        return None
    return (
        f"its node said its TF server listens at {endpoint}, which is not the node's own address "
        f"(it connected from {peer_ip}): not used"
    )
