"""The Testbed class: N sshd "hosts" on this machine, started and stopped as one unit.

It coordinates the other modules (addressing in net, keys, sshds, the state file and teardown)
and keeps the rule the whole package exists for: stop() ends everything the test bed started, by
recorded identity only, even after a failed start, and it never raises.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import pwd
import secrets
import shlex
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import yaml

from . import base, faults
from .base import TestbedError, TestHost
from .hostprocs import _processes_by_host
from .keys import _generate_keys, _write_known_hosts
from .net import _create_network, _plan_hosts, netns_available
from .procs import _alive, _ident
from .spec import _spec_dict, ssh_client_argv
from .sshd import _check_prerequisites, _Sshd, _Sshds
from .state import _create, _free_id, _State, _sync, _teardown

log = logging.getLogger(__name__)


class Testbed:
    """N sshd "hosts" on this machine; a context manager. See the package docstring."""

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
        sshd_options: dict[int, list[str]] | None = None,
    ):
        """`single_sshd` (loopback only, for scale benchmarks): one shared host key and one sshd per
        16 addresses, OpenSSH's MAX_LISTEN_SOCKS limit. `tf_port`: the TF port of every host in
        netns mode, the first one in loopback mode (default: 23456 in netns mode, a random free
        block in loopback mode). `grace_s`: SIGTERM grace before SIGKILL in stop(). `sshd_options`:
        more sshd_config lines for host i (not with single_sshd); ``{hostN}`` and ``{controller}`` in
        them become those addresses (e.g. ``AllowUsers root@{host0}``: host0 is the only way in)."""
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
        self.user = pwd.getpwuid(os.getuid()).pw_name  # every host accepts the test bed key for this user
        # Short (interface names derive from it, max 15 chars) but unique among live test beds: it
        # scopes the env marker, the namespaces and the directory.
        self.id = "tb" + secrets.token_hex(3)
        self.hosts: list[TestHost] = []
        self.controller_netns: str | None = None
        self.controller_address: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.timings: dict[str, float] = {}
        self._tf_port = tf_port
        self._sshd_options = sshd_options or {}
        self._grace = grace_s
        self._start_timeout = start_timeout_s
        self._dir: Path | None = None
        self._fleet: _Sshds | None = None  # the sshds, once start() gets that far
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
                _check_prerequisites(self.mode)
                self._make_dir()
                t = time.monotonic()
                self._plan_hosts()
                _generate_keys(
                    self.dir,
                    self.hosts,
                    self.single_sshd,
                    self.user_key,
                    self.authorized_keys,
                    f"tfcluster-testbed-{self.id}",
                )
                self.timings["keys_s"] = time.monotonic() - t
                if self.mode == "netns":
                    t = time.monotonic()
                    self._build_network()
                    self.timings["network_s"] = time.monotonic() - t
                t = time.monotonic()
                self._start_sshds()
                self.timings["sshd_s"] = time.monotonic() - t
                _write_known_hosts(self.known_hosts, self.hosts, self.dir, self.single_sshd)
            except BaseException:
                self.stop()
                raise
            self.timings["start_s"] = time.monotonic() - t0
            self._phase = "started"
            log.info("test bed %s up: %d %s hosts in %.2fs", self.id, self.n_hosts, self.mode, self.timings["start_s"])
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

    def _make_dir(self) -> None:
        base_dir = str(self.base_dir) if self.base_dir is not None else None
        self.id = _free_id(self.id, base_dir)
        self._state = _create(self.id, base_dir)
        self._dir = Path(self._state.dir)

    def _plan_hosts(self) -> None:
        plan = _plan_hosts(self.mode, self.n_hosts, self.id, self._tf_port)
        self.subnet = plan.subnet
        self.controller_address = plan.controller_address
        self.controller_netns = plan.controller_netns
        self.hosts = plan.hosts

    def _build_network(self) -> None:
        """Bridge namespace + controller and host namespaces, each joined by a veth pair; the
        names are recorded in the state file first, so a crash midway still gets cleaned up."""
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
        _create_network(br, f"{self.id}br0", members, self.subnet.prefixlen)

    def _start_sshds(self) -> None:
        assert self._state is not None
        self._fleet = _Sshds(
            self.id,
            self.dir,
            self.mode,
            self.hosts,
            self._state,
            self.marker,
            self.authorized_keys,
            single_sshd=self.single_sshd,
            start_timeout=self._start_timeout,
            extra=self._extra_sshd_lines,
        )
        self._fleet.start()

    def _extra_sshd_lines(self, host: TestHost) -> list[str]:
        names = {f"host{i}": h.address for i, h in enumerate(self.hosts)}
        names["controller"] = self.controller_address or "127.0.0.1"
        return [line.format(**names) for line in self._sshd_options.get(self.hosts.index(host), [])]

    @property
    def _sshds(self) -> dict[str, _Sshd]:
        """host name -> its sshd (one object shared by several names with single_sshd)."""
        return self._fleet.by_host if self._fleet is not None else {}

    def _all_sshds(self) -> list[_Sshd]:
        return self._fleet.all() if self._fleet is not None else []

    def _sync_state(self) -> None:
        if self._state is not None:
            _sync(self._state, [s.proc for s in self._all_sshds() if s.proc is not None], self._orphans)

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
        deep-merged over the defaults. job.python is this interpreter; the tasks' directories go in the
        bed's own directory (removed by stop()), not in ~/.tfcluster: the hosts share this file system."""
        if not self.hosts or self._dir is None:  # started once: stopped is fine, the spec is just data
            raise TestbedError("test bed not started")
        job = {"remote_dir": str(self._dir / "remote"), **sections.get("job", {})}
        return _spec_dict(
            name,
            command,
            user=self.user,
            user_key=self.user_key,
            known_hosts=self.known_hosts,
            hosts=self.hosts,
            sections={**sections, "job": job},
        )

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
        return _processes_by_host(self.id, hosts, self._all_sshds(), self._sshds, self._orphans, self.marker)

    def kill_sshd(self, host: TestHost | str | int) -> list[psutil.Process]:
        """Fault injection "sshd killed": SIGKILL the host's listening sshd and its per-connection
        sshd processes, leave the user's processes alone (they lose their stdin/stdout). The
        surviving processes stay visible to host_processes() and are ended by stop().
        Returns the user processes left running. See restart_sshd()."""
        self._require_running()
        if self.single_sshd:
            raise TestbedError("kill_sshd needs one sshd per host (single_sshd=False)")
        h = self._host(host)
        return faults.kill_sshd(self._sshds[h.name], self._orphans[h.name], self._sync_state)

    def restart_sshd(self, host: TestHost | str | int) -> None:
        """Start the host's sshd again after kill_sshd (same address, port and host key)."""
        self._require_running()
        assert self._fleet is not None
        if faults.restart_sshd(self._fleet, self._sshds[self._host(host).name]):
            self._sync_state()

    def sshd_pid(self, host: TestHost | str | int) -> int | None:
        """PID of the host's listening sshd (None when it is not running)."""
        s = self._sshds.get(self._host(host).name)
        return s.proc.pid if s is not None and s.proc is not None and _alive(s.proc) else None

    def cut(self, host: TestHost | str | int) -> None:
        """Take the host's link down (netns mode): packets to and from it are dropped silently,
        open TCP connections hang instead of failing."""
        self._require_running()
        faults.set_link(self._host(host), "down")

    def restore(self, host: TestHost | str | int) -> None:
        """Bring the host's link back up after cut()."""
        self._require_running()
        faults.set_link(self._host(host), "up")

    def rate_limit(
        self, host: TestHost | str | int, rate: str | None = "50mbit", burst: str = "64kb", latency: str = "50ms"
    ) -> None:
        """Shape what the host sends (netns mode): `tc tbf` on eth0, the host side of its veth, in its
        namespace (netem is not available here; tbf is). ``rate=None`` removes it."""
        faults.rate_limit(self._host(host), rate, burst, latency)

    def exec_on_host(self, host: TestHost | str | int, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run `argv` "on" the host without SSH: inside its namespace with its hostname in netns
        mode, plainly in loopback mode; with the host's env marker either way. Defaults to
        capture_output=True, text=True, timeout=60."""
        self._require_running()
        h = self._host(host)
        env = dict(kw.pop("env", None) or os.environ)
        env[base.MARKER_ENV] = self.marker(h)
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
        return ssh_client_argv(self._host(host), self.user, self.user_key, self.known_hosts, command)
