"""A multi-host SSH test bed: N real OpenSSH ``sshd`` "hosts" on this one machine.

Used by the test suite, the benchmarks and ``tfcluster demo``. Two modes:

* **loopback** (any user with sshd installed): host *i* is ``127.0.0.(i+2)`` with its own sshd on a
  free port. All hosts share one network stack, so every host gets a different TensorFlow port
  (TF's gRPC server binds ``*:port``).
* **netns** (root): every host is a network namespace with its own address, hostname and sshd on
  port 22, joined by veth pairs to a private bridge that lives in its own namespace, with the SAME
  TensorFlow port on every host, like a real cluster. The launcher under test runs in a controller
  namespace on that bridge (:meth:`Testbed.launcher_argv`); nothing is routed to the real network.

Cleanup is the point: :meth:`Testbed.stop` ends everything the test bed started by PID only (never
by name or pattern), deletes its namespaces and its temp dir; it is idempotent and registered with
``atexit``. A test bed whose owner died without stopping it (SIGKILL) is cleaned up by
:func:`reap_stale`, from the ``state.json`` every test bed keeps in its directory.

This module imports nothing from the rest of ``orchestrator`` on purpose: it is test
infrastructure, and must keep working while the code under test is broken.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

__all__ = [
    "MARKER_ENV",
    "TestHost",
    "Testbed",
    "TestbedError",
    "assert_no_leftovers",
    "leftovers",
    "main",
    "netns_available",
    "reap_stale",
]

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SSHD_PRIVSEP_DIR = Path("/run/sshd")
# Every session sshd starts for a host gets this variable (sshd_config SetEnv), so processes that
# escaped the sshd process tree (daemonized, or orphaned by kill_sshd) can still be found by PID scan.
MARKER_ENV = "TFCLUSTER_TESTBED_HOST"
DIR_PREFIX = "tfcluster-testbed-"
STATE_FILE = "state.json"
# TF ports are chosen below the kernel's ephemeral range, so they never collide with the ssh ports
# (bound with port 0, i.e. from the ephemeral range) or with outgoing connections.
TF_PORT_RANGE = (20000, 30000)
NETNS_TF_PORT = 23456
_MAX_LISTEN_SOCKS = 16  # OpenSSH's compile-time limit of ListenAddress sockets per sshd
_LOOPBACK_FIRST = ipaddress.IPv4Address("127.0.0.2")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class TestbedError(RuntimeError):
    """The test bed could not be built or torn down; the message says what and why."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class TestHost:
    """One "host" of the test bed, as a client (launcher) sees it."""

    __test__ = False  # not a pytest test class

    name: str  # test bed name: host0, host1, ...
    address: str  # where its sshd listens
    ssh_port: int
    tf_port: int  # free TensorFlow port on that host
    netns: str | None  # network namespace (netns mode) or None (loopback)
    hostname: str  # what `hostname` prints on it


def netns_available() -> bool:
    """True when network namespaces can be created here (root and a working ``ip netns``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


# --------------------------------------------------------------------------------------- helpers


def _run(argv: Sequence[str], *, input: str | None = None, timeout: float = 30) -> str:
    """Run a setup command; raise TestbedError with its output when it fails."""
    r = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        detail = (r.stderr or r.stdout).strip()
        raise TestbedError(f"{shlex.join(argv)} failed ({r.returncode}): {detail}")
    return r.stdout


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


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
    try:
        # sshd rewrites its argv in place (setproctitle): drop the empty padding arguments.
        cmd = shlex.join([a for a in p.cmdline() if a]) or p.name()
    except (psutil.Error, OSError):
        cmd = "?"
    return f"pid {p.pid} {cmd[:160]}"


def _hex_addr(h: str) -> str:
    return socket.inet_ntoa(struct.pack("<I", int(h, 16)))


def _socket_inodes(pid: int) -> set[str]:
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
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _keygen(paths: Sequence[Path], comment: str) -> None:
    """ssh-keygen ed25519 keys (no passphrase), several at a time."""
    for i in range(0, len(paths), 16):
        procs = [
            (
                p,
                subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(p)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                ),
            )
            for p in paths[i : i + 16]
        ]
        for p, proc in procs:
            out = proc.communicate(timeout=30)[0]
            if proc.returncode != 0:
                raise TestbedError(f"ssh-keygen for {p} failed: {out.decode(errors='replace').strip()}")


def _pubkey(path: Path) -> str:
    """'TYPE BASE64' of an OpenSSH public key file (comment dropped)."""
    typ, b64 = path.read_text().split()[:2]
    return f"{typ} {b64}"


def _used_ipv4_networks() -> list[ipaddress.IPv4Network]:
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
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


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
        needle = f"{MARKER_ENV}={marker_prefix}".encode() if marker_prefix else None
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


# ------------------------------------------------------------------------------ state / teardown


@dataclass
class _State:
    """What a test bed owns, persisted to DIR/state.json so a later run can clean up after a crash."""

    id: str
    dir: str
    owner: tuple[int, float]
    listeners: list[tuple[int, float]] = field(default_factory=list)
    roots: list[tuple[int, float]] = field(default_factory=list)  # run_on_controller processes
    orphans: list[tuple[int, float]] = field(default_factory=list)  # left behind by kill_sshd
    netns: list[str] = field(default_factory=list)
    controller_netns: str | None = None

    def save(self) -> None:
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(dataclasses.asdict(self)))
            os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> _State:
        d = json.loads(path.read_text())
        for k in ("owner",):
            d[k] = tuple(d[k])
        for k in ("listeners", "roots", "orphans"):
            d[k] = [tuple(x) for x in d[k]]
        return cls(**d)


def _teardown(
    st: _State, *, grace: float = 1.0, popens: Sequence[subprocess.Popen] = ()
) -> tuple[list[tuple[int, float, str]], list[str]]:
    """End every process of a test bed, delete its namespaces and its directory.

    Works from the recorded (pid, create_time) identities, the env marker and namespace membership,
    never from process names. Returns (processes signalled, errors); keeps going after errors.
    """
    errors: list[str] = []
    killed: list[tuple[int, float, str]] = []
    protect = _self_and_ancestors()
    ns_inodes = {ino: n for n in st.netns if (ino := _netns_inode(n)) is not None}
    ctl_names = {st.controller_netns} if st.controller_netns else set()

    def collect(scan: _Scan, controller: bool) -> set[int]:
        pids: set[int] = set()
        recs = st.roots if controller else st.listeners + st.orphans
        for pid, ct in recs:
            p = scan.procs.get(pid)
            if p is not None and abs(p.create_time() - ct) <= 0.01:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        if not controller:
            for pid in scan.marker:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        for pid, ns in scan.netns.items():
            if (ns in ctl_names) == controller:
                pids.add(pid)
                pids.update(scan.descendants(pid))
        return pids - protect

    # Phase 1: the launcher side first, so it cannot react to its hosts dying by reconnecting.
    # Phase 2: everything on the hosts, leaves first, the listening sshds last.
    for controller in (True, False):
        for _ in range(4):  # rescan: a process may have forked or been orphaned meanwhile
            try:
                scan = _Scan(f"{st.id}:", ns_inodes)
                pids = collect(scan, controller)
                if not pids:
                    break
                killed.extend(_kill_ordered(scan, pids, grace, popens))
            except Exception as e:  # keep tearing down whatever happens
                errors.append(f"killing processes: {e!r}")
                break
    for po in popens:
        try:
            po.wait(timeout=5)
        except subprocess.TimeoutExpired:
            errors.append(f"pid {po.pid} did not exit")

    present = [n for n in st.netns if os.path.exists(f"/run/netns/{n}")]
    if present:
        try:
            _run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in present))
        except (TestbedError, OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"deleting namespaces: {e}")
        left = [n for n in present if os.path.exists(f"/run/netns/{n}")]
        if left:
            errors.append(f"namespaces not deleted: {left}")

    d = Path(st.dir)
    if d.name.startswith(DIR_PREFIX) and d.exists():
        try:
            shutil.rmtree(d)
        except OSError as e:
            errors.append(f"removing {d}: {e}")
    return killed, errors


def reap_stale(base_dir: str | Path | None = None) -> list[str]:
    """Clean up test beds whose owning process died without stopping them (e.g. SIGKILL).

    Looks only at ``DIR_PREFIX*`` directories under `base_dir` (default: the temp dir) whose
    state.json names an owner that no longer exists. Returns the directories cleaned.
    """
    base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
    cleaned = []
    for state_file in sorted(base.glob(f"{DIR_PREFIX}*/{STATE_FILE}")):
        try:
            st = _State.load(state_file)
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("ignoring unreadable %s: %s", state_file, e)
            continue
        if _lookup(*st.owner) is not None:
            continue  # owner alive: not ours to clean
        if Path(st.dir).resolve() != state_file.parent.resolve():
            continue
        _, errors = _teardown(st)
        for e in errors:
            log.warning("reap_stale %s: %s", st.dir, e)
        cleaned.append(st.dir)
    return cleaned


# -------------------------------------------------------------------------------------- testbed


@dataclass
class _Sshd:
    """One sshd process and the hosts it serves (one host, or all of them with single_sshd)."""

    hosts: list[TestHost]
    tag: str  # host name, or gN for a group of hosts with single_sshd
    config: Path
    log: Path
    popen: subprocess.Popen | None = None
    proc: psutil.Process | None = None  # identity of the listener once it listens


class Testbed:
    """N sshd "hosts" on this machine; a context manager. See the module docstring."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        n_hosts: int,
        mode: str = "auto",
        base_dir: str | Path | None = None,
        single_sshd: bool = False,
        *,
        tf_port: int | None = None,
        grace_s: float = 1.0,
        start_timeout_s: float = 15.0,
    ):
        """`single_sshd` (loopback only, for scale benchmarks): one shared host key and one sshd per
        16 addresses, OpenSSH's MAX_LISTEN_SOCKS limit. `tf_port`: the TF port of every host in
        netns mode, the first one in loopback mode (default: 23456 in netns mode, a random free
        block in loopback mode). `grace_s`: SIGTERM grace before SIGKILL in stop()."""
        if n_hosts < 1:
            raise ValueError("n_hosts must be >= 1")
        if mode not in ("auto", "loopback", "netns"):
            raise ValueError(f"mode must be auto, loopback or netns, not {mode!r}")
        if single_sshd and mode == "netns":
            raise ValueError("single_sshd is a loopback-mode option")
        if mode == "auto":
            mode = "netns" if not single_sshd and netns_available() else "loopback"
        limit = 252 if mode == "netns" else 1000
        if n_hosts > limit:
            raise ValueError(f"at most {limit} hosts in {mode} mode")
        self.n_hosts = n_hosts
        self.mode = mode
        self.single_sshd = single_sshd
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.user = _current_user()
        # Short (interface names derive from it, max 15 chars) but unique among live test beds: it
        # scopes the env marker, the namespaces and the directory.
        self.id = "tb" + secrets.token_hex(3)
        self.hosts: list[TestHost] = []
        self.controller_netns: str | None = None
        self.controller_address: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.timings: dict[str, float] = {}
        self._tf_port = tf_port
        self._grace = grace_s
        self._start_timeout = start_timeout_s
        self._dir: Path | None = None
        self._sshds: dict[str, _Sshd] = {}  # host name -> its sshd (shared object with single_sshd)
        self._popens: list[subprocess.Popen] = []  # run_on_controller
        self._orphans: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._state: _State | None = None
        self._phase = "new"  # new -> starting -> started -> stopped
        self._lock = threading.RLock()
        self.killed: list[tuple[int, float, str]] = []  # what stop() signalled, for leftover checks
        self.stop_errors: list[str] = []

    # -- paths ----------------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        """The test bed's private directory (keys, configs, logs); removed by stop()."""
        if self._dir is None:
            raise TestbedError("test bed not started")
        return self._dir

    @property
    def user_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"

    @property
    def running(self) -> bool:
        return self._phase == "started"

    def marker(self, host: TestHost) -> str:
        """Value of MARKER_ENV in every process started through `host`'s sshd."""
        return f"{self.id}:{host.name}"

    def __repr__(self) -> str:
        return f"<Testbed {self.id} {self.mode} {self.n_hosts} hosts {self._phase}>"

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Testbed:
        """Generate keys, build the network (netns mode), start every sshd and wait until each
        listens. On any failure everything created so far is torn down before the error propagates."""
        with self._lock:
            if self._phase != "new":
                raise TestbedError(f"start() on a test bed that is {self._phase}")
            self._phase = "starting"
            atexit.register(self.stop)
            t0 = time.monotonic()
            try:
                self._check_prerequisites()
                self._make_dir()
                t = time.monotonic()
                self._plan_hosts()
                self._generate_keys()
                self.timings["keys_s"] = time.monotonic() - t
                if self.mode == "netns":
                    t = time.monotonic()
                    self._build_network()
                    self.timings["network_s"] = time.monotonic() - t
                t = time.monotonic()
                self._start_sshds()
                self.timings["sshd_s"] = time.monotonic() - t
                self._write_known_hosts()
            except BaseException:
                self.stop()
                raise
            self.timings["start_s"] = time.monotonic() - t0
            self._phase = "started"
            log.info(
                "test bed %s up: %d %s hosts in %.2fs",
                self.id,
                self.n_hosts,
                self.mode,
                self.timings["start_s"],
            )
            return self

    def stop(self) -> None:
        """End every process started through the test bed, delete namespaces and the directory.

        Idempotent, safe after a failed start and from atexit; errors are collected in
        `stop_errors` and logged, never raised (a teardown must not hide the test's own failure).
        """
        if self._state is not None and self._state.owner[0] != os.getpid():
            return  # a fork()ed child running our atexit handlers: the test bed is the parent's
        with self._lock:
            if self._phase in ("new", "stopped"):
                self._phase = "stopped"
                with contextlib.suppress(Exception):
                    atexit.unregister(self.stop)
                return
            self._phase = "stopped"
            t0 = time.monotonic()
            if self._state is not None:
                self._sync_state()
                popens = [s.popen for s in self._all_sshds() if s.popen is not None] + self._popens
                killed, errors = _teardown(self._state, grace=self._grace, popens=popens)
                self.killed.extend(killed)
                self.stop_errors.extend(errors)
                for e in errors:
                    log.warning("test bed %s stop: %s", self.id, e)
            self.timings["stop_s"] = time.monotonic() - t0
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)

    # -- start steps ----------------------------------------------------------------------------

    def _check_prerequisites(self) -> None:
        for tool in (SSHD, "ssh-keygen") + (("ip", "unshare") if self.mode == "netns" else ()):
            if shutil.which(tool) is None:
                raise TestbedError(f"{tool} not found: install openssh-server / openssh-client / iproute2")
        if self.mode == "netns" and os.geteuid() != 0:
            raise TestbedError("netns mode needs root; use mode='loopback'")
        if os.geteuid() == 0:
            # sshd started as root refuses to run without its privilege separation directory.
            SSHD_PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.chmod(SSHD_PRIVSEP_DIR, 0o755)
        # Not root: sshd does not chroot for privilege separation and starts without /run/sshd
        # (checked on OpenSSH 9.2); a failure is still reported with the sshd log by _start_sshds.

    def _make_dir(self) -> None:
        base = str(self.base_dir) if self.base_dir is not None else None
        search = {Path(base or tempfile.gettempdir()), Path(tempfile.gettempdir())}
        for _ in range(20):
            taken = any(os.path.exists(f"/run/netns/{self.id}-{s}") for s in ("br", "ctl", "h0")) or any(
                any(d.glob(f"{DIR_PREFIX}{self.id}-*")) for d in search
            )
            if not taken:
                break
            self.id = "tb" + secrets.token_hex(3)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{self.id}-", dir=base)).resolve()
        self._state = _State(id=self.id, dir=str(self._dir), owner=_ident(psutil.Process()))
        self._state.save()

    def _plan_hosts(self) -> None:
        n = self.n_hosts
        if self.mode == "netns":
            self.subnet = _pick_subnet()
            addrs = list(self.subnet.hosts())
            self.controller_address = str(addrs[0])
            self.controller_netns = f"{self.id}-ctl"
            tf = self._tf_port or NETNS_TF_PORT
            self.hosts = [
                TestHost(f"host{i}", str(addrs[i + 1]), 22, tf, f"{self.id}-h{i}", f"host{i}") for i in range(n)
            ]
            return
        addrs = [str(_LOOPBACK_FIRST + i) for i in range(n)]
        tf_ports = self._pick_tf_ports(n)
        hostname = socket.gethostname()
        self.hosts = [
            TestHost(f"host{i}", addrs[i], _free_port(addrs[i]), tf_ports[i], None, hostname) for i in range(n)
        ]

    def _pick_tf_ports(self, n: int) -> list[int]:
        """n consecutive ports, each free on every address (TF's gRPC server binds ``*:port``)."""
        if self._tf_port is not None:
            ports = list(range(self._tf_port, self._tf_port + n))
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

    def _generate_keys(self) -> None:
        host_keys = (
            [self.dir / "host_ed25519"] if self.single_sshd else [self.dir / f"{h.name}_ed25519" for h in self.hosts]
        )
        _keygen([self.user_key, *host_keys], f"tfcluster-testbed-{self.id}")
        self.authorized_keys.write_text(_pubkey(self.user_key.with_suffix(".pub")) + "\n")

    def _host_key(self, host: TestHost) -> Path:
        return self.dir / ("host_ed25519" if self.single_sshd else f"{host.name}_ed25519")

    def _build_network(self) -> None:
        """Bridge namespace + controller and host namespaces, each joined by a veth pair.

        The bridge-side ends are created inside the bridge namespace and the other ends directly
        inside their namespaces, so nothing ever appears in the root namespace.
        """
        assert self._state is not None and self.subnet is not None and self.controller_netns
        br = f"{self.id}-br"
        members = [(f"{self.id}vc", self.controller_netns, self.controller_address)] + [
            (f"{self.id}v{i}", h.netns, h.address) for i, h in enumerate(self.hosts)
        ]
        names = [br] + [ns for _, ns, _ in members]
        clash = [n for n in names if os.path.exists(f"/run/netns/{n}")]
        if clash:
            raise TestbedError(f"network namespaces already exist: {clash}")
        self._state.netns = names
        self._state.controller_netns = self.controller_netns
        self._state.save()  # recorded before creation: a crash midway still gets cleaned up
        _run(["ip", "-batch", "-"], input="".join(f"netns add {n}\n" for n in names))
        bridge = f"{self.id}br0"
        cmds = [f"link add {bridge} type bridge forward_delay 0", f"link set {bridge} up"]
        for veth, ns, _ in members:
            cmds.append(f"link add {veth} type veth peer name eth0 netns {ns}")
            cmds.append(f"link set {veth} master {bridge} up")
        _run(["ip", "-n", br, "-batch", "-"], input="\n".join(cmds) + "\n")
        prefix = self.subnet.prefixlen
        procs = []
        for _, ns, addr in members:
            batch = f"link set lo up\naddr add {addr}/{prefix} dev eth0\nlink set eth0 up\n"
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

    def _sshd_config(self, hosts: list[TestHost], key: Path, tag: str) -> str:
        lines = [
            f"# tfcluster test bed {self.id} ({tag})",
            *(f"ListenAddress {h.address}:{h.ssh_port}" for h in hosts),
            f"HostKey {key}",
            f"PidFile {self.dir / f'sshd-{tag}.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp",
            "MaxStartups 500",
            "MaxSessions 100",
            "LoginGraceTime 30",
            "LogLevel ERROR",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "X11Forwarding no",
            # AcceptEnv: none (no AcceptEnv line; the default accepts nothing)
        ]
        if len(hosts) == 1:
            lines.append(f"SetEnv {MARKER_ENV}={self.marker(hosts[0])}")
        else:
            for h in hosts:  # Match blocks must come last
                lines += [f"Match LocalAddress {h.address}", f"    SetEnv {MARKER_ENV}={self.marker(h)}"]
        return "\n".join(lines) + "\n"

    def _sshd_argv(self, s: _Sshd) -> list[str]:
        base = [SSHD, "-D", "-e", "-f", str(s.config)]
        if self.mode != "netns":
            return base
        h = s.hosts[0]
        inner = f"hostname {shlex.quote(h.hostname)} && exec {shlex.join(base)}"
        # ip netns exec and unshare (without --fork) exec, and sh execs sshd: the Popen pid ends up
        # being the sshd pid, which _wait_listening verifies.
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "sh", "-c", inner]

    def _start_sshds(self) -> None:
        if self.single_sshd:
            # sshd has a compile-time limit of 16 listen sockets (MAX_LISTEN_SOCKS): one sshd per
            # 16 addresses is as close to "one sshd" as OpenSSH allows without binding 0.0.0.0.
            k = _MAX_LISTEN_SOCKS
            groups = [(f"g{i // k}", self.hosts[i : i + k]) for i in range(0, len(self.hosts), k)]
        else:
            groups = [(h.name, [h]) for h in self.hosts]
        sshds = []
        for tag, hosts in groups:
            s = _Sshd(
                hosts=list(hosts), tag=tag, config=self.dir / f"sshd-{tag}.conf", log=self.dir / f"sshd-{tag}.log"
            )
            for h in hosts:
                self._sshds[h.name] = s
            sshds.append(s)
        pending = []
        for s in sshds:
            self._spawn(s)
            pending.append(s)
        self._wait_listening(pending, retries=3)

    def _spawn(self, s: _Sshd) -> None:
        key = self._host_key(s.hosts[0])
        s.config.write_text(self._sshd_config(s.hosts, key, s.tag))
        s.proc = None
        with open(s.log, "wb") as logf:
            s.popen = subprocess.Popen(
                self._sshd_argv(s),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C must not reach sshd: stop() decides
            )
        assert self._state is not None
        # Record the pid at once (create_time read now) so a crash before "listening" is cleaned up.
        with contextlib.suppress(psutil.Error):
            self._state.listeners.append(_ident(psutil.Process(s.popen.pid)))
            self._state.save()

    def _wait_listening(self, pending: list[_Sshd], retries: int) -> None:
        """Poll until every sshd has its listening sockets (read from /proc/PID/net/tcp, so this
        works inside namespaces); respawn on a lost port race in loopback mode."""
        deadline = time.monotonic() + self._start_timeout
        attempts: dict[int, int] = defaultdict(int)
        while pending:
            still = []
            for s in pending:
                assert s.popen is not None
                if s.popen.poll() is not None:
                    text = s.log.read_text(errors="replace") if s.log.exists() else ""
                    if "Address already in use" in text and self.mode == "loopback" and attempts[id(s)] < retries:
                        attempts[id(s)] += 1
                        self._repick_ports(s)
                        self._spawn(s)
                        still.append(s)
                        continue
                    raise TestbedError(self._sshd_failure(s, f"sshd exited with {s.popen.returncode}", text))
                want = {(h.address, h.ssh_port) for h in s.hosts}
                got = {(a, p) for a, p, state in _tcp_sockets(s.popen.pid) if state == "0A"}
                if want <= got:
                    self._adopt(s)
                else:
                    still.append(s)
            pending = still
            if pending and time.monotonic() > deadline:
                s = pending[0]
                text = s.log.read_text(errors="replace") if s.log.exists() else ""
                raise TestbedError(self._sshd_failure(s, f"sshd not listening after {self._start_timeout}s", text))
            if pending:
                time.sleep(0.005)

    def _sshd_failure(self, s: _Sshd, what: str, text: str) -> str:
        hint = ""
        if "privilege separation directory" in text:
            hint = f" (create {SSHD_PRIVSEP_DIR} as root: mkdir -m 0755 {SSHD_PRIVSEP_DIR})"
        names = ", ".join(f"{h.name}={h.address}:{h.ssh_port}" for h in s.hosts[:4])
        return f"{what} for {names}{hint}; config {s.config}; log:\n{text.strip() or '(empty)'}"

    def _adopt(self, s: _Sshd) -> None:
        """Check that the Popen pid is the listening sshd itself (no wrapper left in between)."""
        assert s.popen is not None
        p = psutil.Process(s.popen.pid)
        try:
            exe = p.exe()
        except psutil.Error as e:
            raise TestbedError(f"cannot inspect sshd pid {p.pid}: {e}")
        if os.path.realpath(exe) != os.path.realpath(SSHD):
            raise TestbedError(f"listener pid {p.pid} is {exe}, not {SSHD}")
        s.proc = p

    def _repick_ports(self, s: _Sshd) -> None:
        new = []
        for h in s.hosts:
            nh = dataclasses.replace(h, ssh_port=_free_port(h.address))
            self.hosts[self.hosts.index(h)] = nh
            self._sshds[nh.name] = s
            new.append(nh)
        s.hosts = new

    def _write_known_hosts(self) -> None:
        lines = []
        for h in self.hosts:
            where = h.address if h.ssh_port == 22 else f"[{h.address}]:{h.ssh_port}"
            lines.append(f"{where} {_pubkey(self._host_key(h).with_suffix('.pub'))}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _all_sshds(self) -> list[_Sshd]:
        seen, out = set(), []
        for s in self._sshds.values():
            if id(s) not in seen:
                seen.add(id(s))
                out.append(s)
        return out

    def _sync_state(self) -> None:
        if self._state is None:
            return
        st = self._state
        listeners = set(st.listeners)
        for s in self._all_sshds():
            if s.proc is not None:
                with contextlib.suppress(psutil.Error):
                    listeners.add(_ident(s.proc))
        st.listeners = sorted(listeners)
        st.roots = sorted(set(st.roots))
        st.orphans = sorted({o for v in self._orphans.values() for o in v} | set(st.orphans))
        st.save()

    # -- the launcher side ----------------------------------------------------------------------

    def launcher_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run where the launcher under test must run: the controller namespace in netns
        mode (the only place that reaches the hosts), unchanged in loopback mode."""
        if self.mode == "netns":
            if not self.controller_netns:
                raise TestbedError("test bed not started")
            return ["ip", "netns", "exec", self.controller_netns, *argv]
        return list(argv)

    def run_on_controller(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Popen of `argv` on the controller; stop() ends it (and its children) if still running."""
        self._require_running()
        p = subprocess.Popen(self.launcher_argv(argv), **popen_kwargs)
        self._popens.append(p)
        assert self._state is not None
        with contextlib.suppress(psutil.Error):
            self._state.roots.append(_ident(psutil.Process(p.pid)))
            self._state.save()
        return p

    def spec_dict(self, name: str, command: Sequence[str], **sections: Any) -> dict:
        """A cluster spec (dict) for these hosts; `sections` (e.g. heartbeat=..., job=...) are
        deep-merged over the defaults. job.python is this interpreter so worker_entry imports."""
        self._require_started_once()
        if not _NAME_RE.match(name):
            raise ValueError(f"spec name {name!r}: lowercase letters, digits and '-' only")
        hosts = []
        for h in self.hosts:
            entry: dict[str, Any] = {"address": h.address}
            if h.ssh_port != 22:
                entry["port"] = h.ssh_port
            entry["tf_port"] = h.tf_port
            hosts.append(entry)
        spec: dict[str, Any] = {
            "version": 1,
            "name": name,
            "ssh": {
                "user": self.user,
                "identity_file": str(self.user_key),
                "known_hosts": str(self.known_hosts),
            },
            "hosts": hosts,
            "job": {"command": list(command), "python": sys.executable},
        }
        return _deep_merge(spec, sections)

    def write_spec(self, path: str | Path, name: str, command: Sequence[str], **sections: Any) -> Path:
        """spec_dict() dumped as YAML to `path`."""
        path = Path(path)
        path.write_text(yaml.safe_dump(self.spec_dict(name, command, **sections), sort_keys=False))
        return path

    # -- the host side --------------------------------------------------------------------------

    def _host(self, host: TestHost | str | int) -> TestHost:
        if isinstance(host, int):
            return self.hosts[host]
        name = host if isinstance(host, str) else host.name
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in test bed {self.id}")

    def _require_running(self) -> None:
        if self._phase != "started":
            raise TestbedError(f"test bed {self.id} is {self._phase}, not started")

    def _require_started_once(self) -> None:
        if not self.hosts or self._dir is None:
            raise TestbedError("test bed not started")

    def host_processes(self, host: TestHost | str | int) -> list[psutil.Process]:
        """Every live process "on" `host`, excluding its listening sshd: descendants of its sshd
        (per-connection sshd processes included), plus processes that left that tree but carry
        the host's env marker or were orphaned by kill_sshd, plus (netns mode) every process in the
        host's namespace."""
        h = self._host(host)
        return self.processes_by_host([h])[h.name]

    def processes_by_host(self, hosts: Sequence[TestHost] | None = None) -> dict[str, list[psutil.Process]]:
        """host_processes() for several hosts (default: all) from a single /proc scan."""
        hosts = list(self.hosts if hosts is None else hosts)
        inodes = {ino: h.netns for h in hosts if h.netns and (ino := _netns_inode(h.netns)) is not None}
        scan = _Scan(f"{self.id}:", inodes)
        protect = _self_and_ancestors()
        out: dict[str, list[psutil.Process]] = {}
        conn_addr: dict[int, set[str]] = {}  # single_sshd: per-connection sshd -> local addresses
        for s in self._all_sshds():
            if len(s.hosts) > 1 and s.proc is not None and s.proc.pid in scan.procs:
                table = _tcp_table(s.proc.pid)
                for child in scan.children.get(s.proc.pid, ()):
                    inodes = _socket_inodes(child)
                    conn_addr[child] = {table[i][0] for i in inodes if i in table and table[i][2] != "0A"}
        for h in hosts:
            pids: set[int] = set()

            def add(pid: int, pids: set[int] = pids) -> None:
                pids.add(pid)
                pids.update(scan.descendants(pid))

            s = self._sshds.get(h.name)
            listener = s.proc if s is not None else None
            if listener is not None and listener.pid in scan.procs and _alive(listener):
                if len(s.hosts) > 1:  # single_sshd: tell hosts apart by the connection's local address
                    for child in scan.children.get(listener.pid, ()):
                        if h.address in conn_addr.get(child, ()):
                            add(child)
                else:
                    pids.update(scan.descendants(listener.pid))
            for pid, ct in self._orphans.get(h.name, ()):
                if (p := scan.procs.get(pid)) is not None and abs(p.create_time() - ct) <= 0.01:
                    add(pid)
            marker = self.marker(h)
            for pid, value in scan.marker.items():
                if value == marker:
                    add(pid)
            for pid, ns in scan.netns.items():
                if ns == h.netns:
                    add(pid)
            if listener is not None:
                pids.discard(listener.pid)
            pids -= protect
            out[h.name] = [scan.procs[p] for p in sorted(pids) if p in scan.procs and _alive(scan.procs[p])]
        return out

    def kill_sshd(self, host: TestHost | str | int) -> list[psutil.Process]:
        """Fault injection "sshd killed": SIGKILL the host's listening sshd and its per-connection
        sshd processes, leave the user's processes alone (they lose their stdin/stdout). The
        surviving processes stay visible to host_processes() and are ended by stop().
        Returns the user processes left running. See restart_sshd()."""
        self._require_running()
        if self.single_sshd:
            raise TestbedError("kill_sshd needs one sshd per host (single_sshd=False)")
        h = self._host(host)
        s = self._sshds[h.name]
        if s.proc is None or not _alive(s.proc):
            return []
        scan = _Scan()
        sshd_exe = os.path.realpath(SSHD)
        tree = [s.proc.pid, *scan.descendants(s.proc.pid)]
        sshd_pids, user = [], []
        for pid in tree:
            p = scan.procs.get(pid)
            if p is None:
                continue
            try:
                is_sshd = os.path.realpath(p.exe()) == sshd_exe
            except psutil.Error:
                is_sshd = False
            (sshd_pids if is_sshd else user).append(pid)
        for pid in user:
            with contextlib.suppress(psutil.Error):
                self._orphans[h.name].append(_ident(scan.procs[pid]))
        self._sync_state()
        # Deepest first and one level at a time, so each dies while its parent can still reap it.
        for group in scan.depth_order(sshd_pids):
            procs = [scan.procs[p] for p in group]
            _signal(procs, signal.SIGKILL)
            _wait_dead(procs, 5.0, [s.popen] if s.popen else [])
        if s.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.popen.wait(timeout=5)
        return [scan.procs[p] for p in user if _alive(scan.procs[p])]

    def restart_sshd(self, host: TestHost | str | int) -> None:
        """Start the host's sshd again after kill_sshd (same address, port and host key)."""
        self._require_running()
        h = self._host(host)
        s = self._sshds[h.name]
        if s.proc is not None and _alive(s.proc):
            return
        self._spawn(s)
        self._wait_listening([s], retries=0)
        self._sync_state()

    def sshd_pid(self, host: TestHost | str | int) -> int | None:
        """PID of the host's listening sshd (None when it is not running)."""
        s = self._sshds.get(self._host(host).name)
        return s.proc.pid if s is not None and s.proc is not None and _alive(s.proc) else None

    def cut(self, host: TestHost | str | int) -> None:
        """Take the host's link down (netns mode): packets to and from it are dropped silently,
        open TCP connections hang instead of failing."""
        self._link(host, "down")

    def restore(self, host: TestHost | str | int) -> None:
        """Bring the host's link back up after cut()."""
        self._link(host, "up")

    def _link(self, host: TestHost | str | int, state: str) -> None:
        self._require_running()
        h = self._host(host)
        if h.netns is None:
            raise TestbedError("cut()/restore() need netns mode (loopback hosts share one stack)")
        _run(["ip", "-n", h.netns, "link", "set", "eth0", state])

    def exec_on_host(self, host: TestHost | str | int, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run `argv` "on" the host without SSH: inside its namespace with its hostname in netns
        mode, plainly in loopback mode; with the host's env marker either way. Defaults to
        capture_output=True, text=True, timeout=60."""
        self._require_running()
        h = self._host(host)
        env = dict(kw.pop("env", None) or os.environ)
        env[MARKER_ENV] = self.marker(h)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        full = list(argv)
        if h.netns:
            inner = f'hostname {shlex.quote(h.hostname)} && exec "$@"'
            full = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "sh", "-c", inner, "sh", *argv]
        return subprocess.run(full, env=env, **kw)

    def ssh_argv(self, host: TestHost | str | int, command: Sequence[str] = ()) -> list[str]:
        """An OpenSSH client command line for `host` (strict host key checking on), for humans and
        for tests that want the real ssh client; prefix with launcher_argv() in netns mode."""
        h = self._host(host)
        return [
            "ssh", "-i", str(self.user_key), "-p", str(h.ssh_port),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", f"{self.user}@{h.address}", *command,
        ]  # fmt: skip


# ---------------------------------------------------------------------------------- leftovers


def leftovers(tb: Testbed, *, include_sessions: bool = False) -> list[str]:
    """What of the test bed is still there, one line each.

    Running test bed: processes on its hosts other than sshd itself (`include_sessions=True`
    also lists per-connection sshd processes, i.e. SSH connections still open). Stopped test bed:
    any process it signalled or started that is still alive, processes still carrying its env
    marker, its namespaces and its directory.
    """
    out: list[str] = []
    if tb.running:
        sshd_exe = os.path.realpath(SSHD)
        for name, procs in tb.processes_by_host().items():
            for p in procs:
                try:
                    is_sshd = os.path.realpath(p.exe()) == sshd_exe
                except psutil.Error:
                    is_sshd = False
                if include_sessions or not is_sshd:
                    out.append(f"{name}: {_describe(p)}")
        return out
    st = tb._state
    recorded = list(tb.killed)
    if st is not None:
        recorded += [(pid, ct, "recorded") for pid, ct in st.listeners + st.roots + st.orphans]
    seen = set()
    for pid, ct, desc in recorded:
        if (pid, ct) in seen:
            continue
        seen.add((pid, ct))
        if (p := _lookup(pid, ct)) is not None:
            out.append(f"alive: {_describe(p)} ({desc})")
    protect = _self_and_ancestors()
    scan = _Scan(f"{tb.id}:")
    for pid, value in scan.marker.items():
        if pid not in protect and (pid, scan.procs[pid].create_time()) not in seen:
            out.append(f"alive with {MARKER_ENV}={value}: {_describe(scan.procs[pid])}")
    if st is not None:
        out += [f"namespace {n}" for n in st.netns if os.path.exists(f"/run/netns/{n}")]
        if os.path.exists(st.dir):
            out.append(f"directory {st.dir}")
    return out


def assert_no_leftovers(tb: Testbed, *, timeout: float = 5.0, include_sessions: bool = False) -> None:
    """Assert leftovers(tb) is empty, polling up to `timeout` (remote processes die asynchronously
    after a launcher stops them)."""
    deadline = time.monotonic() + timeout
    while True:
        found = leftovers(tb, include_sessions=include_sessions)
        if not found or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert not found, f"test bed {tb.id} left behind:\n  " + "\n  ".join(found)


# ----------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m orchestrator.testbed`: start a test bed, write a spec, wait for Ctrl-C/SIGTERM."""
    ap = argparse.ArgumentParser(
        prog="python -m orchestrator.testbed",
        description="Start N local sshd 'hosts', write a cluster spec for them, wait for Ctrl-C.",
    )
    ap.add_argument("--hosts", type=int, default=3, help="number of hosts (default 3)")
    ap.add_argument("--mode", choices=["auto", "loopback", "netns"], default="auto")
    ap.add_argument("--single-sshd", action="store_true", help="loopback: one sshd for all addresses")
    ap.add_argument("--spec-out", type=Path, help="where to write the spec (default: in the test bed dir)")
    ap.add_argument("--name", default="testbed", help="job name in the spec (default: testbed)")
    ap.add_argument("--base-dir", help="parent of the test bed directory (default: the temp dir)")
    ap.add_argument("--tf-port", type=int, help="TF port (netns: all hosts; loopback: first host)")
    ap.add_argument("--reap", action="store_true", help="clean up test beds of dead processes and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("command", nargs="*", help="job command for the spec (after --)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")

    if args.reap:
        for d in reap_stale(args.base_dir):
            print(f"cleaned {d}")
        return 0
    command = args.command or ["python3", "-c", "import socket; print(socket.gethostname())"]
    stop_event = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_event.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    tb = Testbed(args.hosts, mode=args.mode, base_dir=args.base_dir, single_sshd=args.single_sshd, tf_port=args.tf_port)
    try:
        tb.start()
        spec = tb.write_spec(args.spec_out or tb.dir / "cluster.yaml", args.name, command)
        print(f"test bed {tb.id}: {len(tb.hosts)} hosts, {tb.mode} mode, up in {tb.timings['start_s']:.2f}s")
        for h in tb.hosts:
            extra = f" netns {h.netns}" if h.netns else ""
            print(f"  {h.name:8} {h.address}:{h.ssh_port}  tf_port {h.tf_port}  hostname {h.hostname}{extra}")
        if tb.controller_netns:
            print(f"  controller netns {tb.controller_netns} ({tb.controller_address})")
        print(f"spec: {spec}")
        launch = tb.launcher_argv([sys.executable, "-m", "orchestrator", "launch", str(spec)])
        print(f"run the launcher:  {shlex.join(launch)}")
        print(f"ssh to host0:      {shlex.join(tb.launcher_argv(tb.ssh_argv(tb.hosts[0])))}")
        print("Ctrl-C or SIGTERM tears everything down.", flush=True)
        while not stop_event.wait(1.0):
            dead = [s.hosts[0].name for s in tb._all_sshds() if s.popen is not None and s.popen.poll() is not None]
            if dead and not stop_event.is_set():
                log.debug("sshd not running for %s", dead)
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        tb.stop()
        for e in tb.stop_errors:
            print(f"teardown: {e}", file=sys.stderr)
    print(f"torn down in {tb.timings.get('stop_s', 0):.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
