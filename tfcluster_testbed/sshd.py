"""The OpenSSH sshd processes that make the test bed's "hosts".

One sshd per host (or, with single_sshd, one per 16 addresses), started in the foreground so its
Popen pid is the listening sshd itself: the test bed records that identity at once and kills by
it. Listening is checked through /proc (works inside namespaces); a lost race for a free port in
loopback mode is retried with new ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import base, net
from .base import TestbedError, TestHost
from .keys import _host_key
from .procs import _alive, _ident, _Scan, _signal, _tcp_sockets, _wait_dead
from .state import _State

# Read only in this module (bare names are looked up at call time): patch them here, e.g.
# monkeypatch.setattr(tfcluster_testbed.sshd, "SSHD", "/bin/false").
SSHD = "/usr/sbin/sshd"
SSHD_PRIVSEP_DIR = Path("/run/sshd")
_MAX_LISTEN_SOCKS = 16  # OpenSSH's compile-time limit of ListenAddress sockets per sshd


def _check_prerequisites(mode: str) -> None:
    """Fail early with an install hint rather than with an obscure error halfway through start()."""
    for tool in (SSHD, "ssh-keygen") + (("ip", "unshare") if mode == "netns" else ()):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} not found: install openssh-server / openssh-client / iproute2")
    if mode == "netns" and os.geteuid() != 0:
        raise TestbedError("netns mode needs root; use mode='loopback'")
    if os.geteuid() == 0:
        # sshd started as root refuses to run without its privilege separation directory.
        SSHD_PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(SSHD_PRIVSEP_DIR, 0o755)
    # Not root: sshd does not chroot for privilege separation and starts without /run/sshd
    # (checked on OpenSSH 9.2); a failure is still reported with the sshd log by _Sshds.start.


def _is_sshd(p: psutil.Process) -> bool:
    """Whether `p` runs the sshd binary (a listener or a per-connection sshd, not a user process)."""
    try:
        return os.path.realpath(p.exe()) == os.path.realpath(SSHD)
    except psutil.Error:
        return False


@dataclass
class _Sshd:
    """One sshd process and the hosts it serves (one host, or all of them with single_sshd)."""

    hosts: list[TestHost]
    tag: str  # host name, or gN for a group of hosts with single_sshd
    config: Path
    log: Path
    popen: subprocess.Popen | None = None
    proc: psutil.Process | None = None  # identity of the listener once it listens


class _Sshds:
    """The sshds of one test bed, by host name (several names share one _Sshd with single_sshd).

    `hosts` is the test bed's own host list: a port re-pick replaces its entries in place.
    """

    def __init__(
        self,
        tb_id: str,
        directory: Path,
        mode: str,
        hosts: list[TestHost],
        state: _State,
        marker: Callable[[TestHost], str],
        authorized_keys: Path,
        *,
        single_sshd: bool,
        start_timeout: float,
        extra: Callable[[TestHost], list[str]] | None = None,
    ):
        self.extra = extra  # more sshd_config lines for a host (e.g. AllowUsers for a bastion test)
        self.tb_id = tb_id
        self.dir = directory
        self.mode = mode
        self.hosts = hosts
        self.state = state
        self.marker = marker
        self.authorized_keys = authorized_keys
        self.single_sshd = single_sshd
        self.start_timeout = start_timeout
        self.by_host: dict[str, _Sshd] = {}

    def all(self) -> list[_Sshd]:
        """Every distinct sshd, in host order."""
        seen, out = set(), []
        for s in self.by_host.values():
            if id(s) not in seen:
                seen.add(id(s))
                out.append(s)
        return out

    def config(self, hosts: list[TestHost], key: Path, tag: str) -> str:
        """sshd_config: key auth only, no PAM, and the env marker for every session."""
        lines = [
            f"# tfcluster test bed {self.tb_id} ({tag})",
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
        if self.extra is not None and len(hosts) == 1:
            lines += self.extra(hosts[0])
        # TMPDIR: the bed's own temporary directory, removed with the bed by stop(): what a session's
        # processes leave in it (TensorFlow's __autograph_generated_file*.py, a script's mkdtemp) goes
        # with the bed instead of piling up in the machine's /tmp
        tmp = f"TMPDIR={self.tmpdir}"
        if len(hosts) == 1:
            lines.append(f"SetEnv {base.MARKER_ENV}={self.marker(hosts[0])} {tmp}")
        else:
            for h in hosts:  # Match blocks must come last
                lines += [f"Match LocalAddress {h.address}", f"    SetEnv {base.MARKER_ENV}={self.marker(h)} {tmp}"]
        return "\n".join(lines) + "\n"

    @property
    def tmpdir(self) -> Path:
        """TMPDIR of every session of every host (created by start(); inside the bed's directory)."""
        return self.dir / "tmp"

    def argv(self, s: _Sshd) -> list[str]:
        """sshd in the foreground; in netns mode inside the host's namespace with its hostname."""
        cmd = [SSHD, "-D", "-e", "-f", str(s.config)]
        if self.mode != "netns":
            return cmd
        h = s.hosts[0]
        inner = f"hostname {shlex.quote(h.hostname)} && exec {shlex.join(cmd)}"
        # ip netns exec and unshare (without --fork) exec, and sh execs sshd: the Popen pid ends up
        # being the sshd pid, which wait_listening verifies.
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "sh", "-c", inner]

    def start(self) -> None:
        """Spawn every sshd, then wait until all of them listen."""
        self.tmpdir.mkdir(mode=0o700, exist_ok=True)
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
                self.by_host[h.name] = s
            sshds.append(s)
        pending = []
        for s in sshds:
            self.spawn(s)
            pending.append(s)
        self.wait_listening(pending, retries=3)

    def spawn(self, s: _Sshd) -> None:
        """(Re)write the config and start the sshd, recording its identity in the state file."""
        key = _host_key(self.dir, s.hosts[0], self.single_sshd)
        s.config.write_text(self.config(s.hosts, key, s.tag))
        s.proc = None
        with open(s.log, "wb") as logf:
            s.popen = subprocess.Popen(
                self.argv(s),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C must not reach sshd: stop() decides
            )
        # Record the pid at once (create_time read now) so a crash before "listening" is cleaned up.
        with contextlib.suppress(psutil.Error):
            self.state.listeners.append(_ident(psutil.Process(s.popen.pid)))
            self.state.save()

    def wait_listening(self, pending: list[_Sshd], retries: int) -> None:
        """Poll until every sshd has its listening sockets (read from /proc/PID/net/tcp, so this
        works inside namespaces); respawn on a lost port race in loopback mode."""
        deadline = time.monotonic() + self.start_timeout
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
                        self.spawn(s)
                        still.append(s)
                        continue
                    raise TestbedError(self._failure(s, f"sshd exited with {s.popen.returncode}", text))
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
                raise TestbedError(self._failure(s, f"sshd not listening after {self.start_timeout}s", text))
            if pending:
                time.sleep(0.005)

    def _failure(self, s: _Sshd, what: str, text: str) -> str:
        """The error message for an sshd that did not come up: which hosts, a hint, its log."""
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
        """New free ssh ports for the hosts of `s` (someone took the first pick meanwhile)."""
        new = []
        for h in s.hosts:
            nh = dataclasses.replace(h, ssh_port=net._free_port(h.address))
            self.hosts[self.hosts.index(h)] = nh
            self.by_host[nh.name] = s
            new.append(nh)
        s.hosts = new


def _split_tree(s: _Sshd) -> tuple[_Scan, list[int], list[int]]:
    """(scan, sshd pids, user pids) of the listener `s` and everything below it."""
    assert s.proc is not None
    scan = _Scan()
    tree = [s.proc.pid, *scan.descendants(s.proc.pid)]
    sshd_pids, user = [], []
    for pid in tree:
        p = scan.procs.get(pid)
        if p is None:
            continue
        (sshd_pids if _is_sshd(p) else user).append(pid)
    return scan, sshd_pids, user


def _kill_tree(scan: _Scan, sshd_pids: list[int], s: _Sshd) -> None:
    """SIGKILL the sshd processes of `s`; deepest first and one level at a time, so each dies
    while its parent can still reap it."""
    for group in scan.depth_order(sshd_pids):
        procs = [scan.procs[p] for p in group]
        _signal(procs, signal.SIGKILL)
        _wait_dead(procs, 5.0, [s.popen] if s.popen else [])
    if s.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.popen.wait(timeout=5)


def _listener_alive(s: _Sshd | None) -> bool:
    """Whether `s` has a listening sshd that is still running."""
    return s is not None and s.proc is not None and _alive(s.proc)
