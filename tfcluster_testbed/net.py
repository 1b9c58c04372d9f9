"""Addresses, ports and network namespaces of the test bed hosts.

Loopback hosts share this machine's network stack, so each needs its own free ports; netns hosts
get a private subnet that overlaps nothing configured here, joined by a bridge in its own
namespace so nothing ever appears in (or is routed to) the root namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from .base import TestbedError, TestHost

# TF ports are chosen below the kernel's ephemeral range, so they never collide with the ssh ports
# (bound with port 0, i.e. from the ephemeral range) or with outgoing connections.
TF_PORT_RANGE = (20000, 30000)
NETNS_TF_PORT = 23456
_LOOPBACK_FIRST = ipaddress.IPv4Address("127.0.0.2")


def netns_available() -> bool:
    """True when network namespaces can be created here (root and a working ``ip netns``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _run(argv: Sequence[str], *, input: str | None = None, timeout: float = 30) -> str:
    """Run a setup command; raise TestbedError with its output when it fails."""
    r = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        detail = (r.stderr or r.stdout).strip()
        raise TestbedError(f"{shlex.join(argv)} failed ({r.returncode}): {detail}")
    return r.stdout


def tbf_argv(netns: str, rate: str | None, burst: str, latency: str) -> list[str]:
    """``tc`` shaping (or, with ``rate`` None, unshaping) what a namespace host sends on its eth0."""
    if rate is None:
        return ["tc", "-n", netns, "qdisc", "del", "dev", "eth0", "root"]
    shape = ["tbf", "rate", rate, "burst", burst, "latency", latency]
    return ["tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", *shape]


def _port_free(port: int) -> bool:
    """Whether a server could bind ``*:port`` (IPv4 and, when available, IPv6) right now."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for fam, any_addr in families:
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            continue  # family not supported here
        try:
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((any_addr, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def _free_port(addr: str) -> int:
    """A port the kernel says is free on `addr` now (another process may still take it first:
    the sshd start retries on "Address already in use")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _pick_tf_ports(n: int, first: int | None) -> list[int]:
    """n consecutive ports, each free on every address (TF's gRPC server binds ``*:port``),
    starting at `first` when given."""
    if first is not None:
        ports = list(range(first, first + n))
        busy = [p for p in ports if not _port_free(p)]
        if busy:
            raise TestbedError(f"TF ports in use: {busy[:10]}")
        return ports
    lo, hi = TF_PORT_RANGE
    rng = random.SystemRandom()
    for _ in range(50):
        base = rng.randrange(lo, hi - n)
        ports = list(range(base, base + n))
        if all(_port_free(p) for p in ports):
            return ports
    raise TestbedError(f"no block of {n} free TF ports in {lo}-{hi}")


def _used_ipv4_networks() -> list[ipaddress.IPv4Network]:
    """Networks of the root namespace's addresses and routes (best effort)."""
    nets = []
    with contextlib.suppress(TestbedError, OSError, subprocess.TimeoutExpired):
        for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+/\d+)", _run(["ip", "-o", "-4", "addr", "show"])):
            nets.append(ipaddress.IPv4Network(m.group(1), strict=False))
    with contextlib.suppress(TestbedError, OSError, subprocess.TimeoutExpired):
        for line in _run(["ip", "-4", "route", "show", "table", "all"]).splitlines():
            tok = line.split()[0] if line.split() else ""
            if tok in ("broadcast", "local", "unicast") and len(line.split()) > 1:
                tok = line.split()[1]
            with contextlib.suppress(ValueError):
                if tok != "default":
                    nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    """A random 10.R.S.0/24 that overlaps nothing configured in the root namespace."""
    used = _used_ipv4_networks()
    rng = random.SystemRandom()
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{rng.randint(64, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise TestbedError("no free 10.x.y.0/24 subnet for the test bed")


def _netns_inode(name: str) -> int | None:
    """Inode of a named namespace (what /proc/PID/ns/net of its processes points to), or None."""
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


@dataclass
class _HostPlan:
    """Where the hosts of a test bed live, decided before anything is started."""

    hosts: list[TestHost]
    subnet: ipaddress.IPv4Network | None = None  # netns mode only, as are the two below
    controller_address: str | None = None
    controller_netns: str | None = None


def _plan_hosts(mode: str, n: int, tb_id: str, tf_port: int | None) -> _HostPlan:
    """Addresses, ports, namespaces and hostnames of `n` hosts. netns: one subnet, port 22 and the
    same TF port everywhere, like a real cluster; loopback: 127.0.0.2 on, distinct free ports."""
    if mode == "netns":
        subnet = _pick_subnet()
        addrs = list(subnet.hosts())
        tf = tf_port or NETNS_TF_PORT
        hosts = [TestHost(f"host{i}", str(addrs[i + 1]), 22, tf, f"{tb_id}-h{i}", f"host{i}") for i in range(n)]
        return _HostPlan(hosts, subnet, str(addrs[0]), f"{tb_id}-ctl")
    addrs_lo = [str(_LOOPBACK_FIRST + i) for i in range(n)]
    tf_ports = _pick_tf_ports(n, tf_port)
    hostname = socket.gethostname()
    return _HostPlan(
        [TestHost(f"host{i}", addrs_lo[i], _free_port(addrs_lo[i]), tf_ports[i], None, hostname) for i in range(n)]
    )


def _create_network(br_netns: str, bridge: str, members: Sequence[tuple[str, str, str]], prefixlen: int) -> None:
    """Create the bridge namespace `br_netns` (bridge `bridge` inside it) and one namespace per
    (veth name, namespace, address) member, each joined to the bridge by a veth pair.

    The bridge-side ends are created inside the bridge namespace and the other ends directly
    inside their namespaces, so nothing ever appears in the root namespace.
    """
    names = [br_netns] + [ns for _, ns, _ in members]
    _run(["ip", "-batch", "-"], input="".join(f"netns add {n}\n" for n in names))
    cmds = [f"link add {bridge} type bridge forward_delay 0", f"link set {bridge} up"]
    for veth, ns, _ in members:
        cmds.append(f"link add {veth} type veth peer name eth0 netns {ns}")
        cmds.append(f"link set {veth} master {bridge} up")
    _run(["ip", "-n", br_netns, "-batch", "-"], input="\n".join(cmds) + "\n")
    procs = []
    for _, ns, addr in members:
        batch = f"link set lo up\naddr add {addr}/{prefixlen} dev eth0\nlink set eth0 up\n"
        p = subprocess.Popen(
            ["ip", "-n", ns, "-batch", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append((ns, p, batch))
    for ns, p, batch in procs:
        out = p.communicate(batch, timeout=30)[0]
        if p.returncode != 0:
            raise TestbedError(f"configuring namespace {ns} failed: {out.strip()}")
