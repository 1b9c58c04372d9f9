"""Pytest fixtures and helpers for the SSH test bed (the tfcluster_testbed package).

Use from conftest.py with either of::

    pytest_plugins = ["testbed_fixtures"]          # tests/ on sys.path (pytest's default "prepend" mode)
    from testbed_fixtures import *  # noqa: F403   # or: from tests.testbed_fixtures import ...

Fixtures:

* ``testbed_factory`` (function scope): ``make(n_hosts=3, mode="loopback", **kw) -> Testbed``, started;
  every test bed it made is stopped at teardown, then the teardown fails if anything is left.
* ``session_testbed_factory``: the same, torn down at the end of the session (share a test bed
  between tests that do not break it).
* ``reap_stale_testbeds`` (session, autouse once imported): cleans up test beds of earlier runs that
  were killed before they could stop (see ``reap_stale``).

The factory defaults to loopback mode because a pytest process can reach loopback hosts directly
(in-process paramiko); in netns mode the hosts are reachable only from the controller namespace,
so run the launcher with ``tb.launcher_argv(...)``/``tb.run_on_controller(...)``, or use
``ssh_from_controller``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import paramiko
import pytest

from tfcluster_testbed import Testbed, TestHost, leftovers, netns_available, reap_stale

__all__ = [
    "connect",
    "reap_stale_testbeds",
    "requires_netns",
    "session_testbed_factory",
    "ssh_from_controller",
    "testbed_factory",
]

requires_netns = pytest.mark.skipif(not netns_available(), reason="netns mode needs root and `ip netns`")


def connect(tb: Testbed, host: TestHost, *, known_hosts: str | None = None, **kw: Any) -> paramiko.SSHClient:
    """A paramiko client connected to a loopback `host` the way the launcher connects: the test
    bed's key, its known_hosts and RejectPolicy (strict host key checking)."""
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts or str(tb.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    opts = dict(
        port=host.ssh_port,
        username=tb.user,
        key_filename=str(tb.user_key),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
    )
    opts.update(kw)
    try:
        client.connect(host.address, **opts)
    except BaseException:
        client.close()
        raise
    return client


_PROBE = r"""
import json, sys, paramiko
a = json.loads(sys.argv[1])
out = {}
for h in a["hosts"]:
    c = paramiko.SSHClient()
    c.load_host_keys(a["known_hosts"])
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        c.connect(h["address"], port=h["port"], username=a["user"], key_filename=a["key"],
                  look_for_keys=False, allow_agent=False, timeout=a["timeout"],
                  banner_timeout=a["timeout"], auth_timeout=a["timeout"])
        _, o, e = c.exec_command(a["command"], timeout=a["timeout"] + 10)
        text = o.read().decode()
        out[h["name"]] = {"rc": o.channel.recv_exit_status(), "out": text, "err": e.read().decode()}
    except Exception as exc:
        out[h["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        c.close()
print(json.dumps(out))
"""


def ssh_from_controller(
    tb: Testbed, command: str, hosts: Sequence[TestHost] | None = None, *, timeout: float = 5.0
) -> dict[str, dict]:
    """Run `command` over SSH (paramiko, RejectPolicy) on each host, from a Python process on the
    controller (its namespace in netns mode). Returns {host name: {"rc", "out", "err"} or {"error"}}."""
    args = {
        "hosts": [{"name": h.name, "address": h.address, "port": h.ssh_port} for h in (hosts or tb.hosts)],
        "known_hosts": str(tb.known_hosts),
        "user": tb.user,
        "key": str(tb.user_key),
        "command": command,
        "timeout": timeout,
    }
    p = tb.run_on_controller(
        [sys.executable, "-c", _PROBE, json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = p.communicate(timeout=60 + 2 * timeout * len(args["hosts"]))
    if p.returncode != 0:
        raise AssertionError(f"controller probe failed ({p.returncode}): {err}")
    return json.loads(out)


class _Factory:
    def __init__(self) -> None:
        self.beds: list[Testbed] = []

    def __call__(self, n_hosts: int = 3, mode: str = "loopback", **kw: Any) -> Testbed:
        tb = Testbed(n_hosts, mode=mode, **kw)
        self.beds.append(tb)
        return tb.start()

    def finish(self) -> None:
        for tb in reversed(self.beds):
            tb.stop()
        problems = []
        for tb in self.beds:
            problems += [f"{tb.id}: {e}" for e in tb.stop_errors]
            problems += [f"{tb.id}: {x}" for x in leftovers(tb)]
        assert not problems, "test bed teardown left problems:\n  " + "\n  ".join(problems)


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., Testbed]]:
    """make(n_hosts=3, mode="loopback", **Testbed kwargs) -> started Testbed, stopped and checked
    for leftovers at teardown."""
    f = _Factory()
    try:
        yield f
    finally:
        f.finish()


@pytest.fixture(scope="session")
def session_testbed_factory() -> Iterator[Callable[..., Testbed]]:
    """Like testbed_factory, torn down at the end of the session."""
    f = _Factory()
    try:
        yield f
    finally:
        f.finish()


@pytest.fixture(scope="session", autouse=True)
def reap_stale_testbeds() -> None:
    """Clean up test beds left behind by earlier runs that were killed (their owner is dead)."""
    reap_stale()
