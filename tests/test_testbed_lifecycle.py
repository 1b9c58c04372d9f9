"""The SSH test bed itself: a failed start cleans up, a lost port race is retried, a killed owner's
leftovers are reaped, the CLI entry point, and hosts in network namespaces (cut, restore, two beds side
by side). Real sshd, real paramiko with RejectPolicy, no mocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from waiting import wait_for

import tfcluster_testbed.net as testbed_net
import tfcluster_testbed.sshd as testbed_sshd
from tfcluster_testbed import (
    MARKER_ENV,
    Testbed,
    TestbedError,
    assert_no_leftovers,
    reap_stale,
)

try:
    from testbed_fixtures import connect, requires_netns, ssh_from_controller, testbed_factory
except ImportError:  # tests/ imported as a package
    from tests.testbed_fixtures import connect, requires_netns, ssh_from_controller, testbed_factory
from testbed_probes import REPO, eof_roundtrip, gone, named, run

__all__ = ["testbed_factory"]  # re-exported fixture

pytestmark = pytest.mark.timeout(60)


def test_start_failure_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setattr(testbed_sshd, "SSHD", "/bin/false")  # read there at call time
    tb = Testbed(2, mode="loopback", base_dir=tmp_path)
    with pytest.raises(TestbedError, match="sshd exited"):
        tb.start()
    assert list(tmp_path.iterdir()) == []
    assert_no_leftovers(tb, timeout=0)

    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    try:
        with pytest.raises(TestbedError, match="TF ports in use"):
            Testbed(1, mode="loopback", base_dir=tmp_path, tf_port=s.getsockname()[1]).start()
    finally:
        s.close()
    assert list(tmp_path.iterdir()) == []


def test_lost_ssh_port_race_is_retried(testbed_factory, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.2", 0))
    busy.listen()
    real, calls = testbed_net._free_port, []

    def racy_free_port(addr: str) -> int:  # the first pick is taken by someone else meanwhile
        calls.append(addr)
        return busy.getsockname()[1] if len(calls) == 1 else real(addr)

    monkeypatch.setattr(testbed_net, "_free_port", racy_free_port)  # read there at call time
    try:
        tb = testbed_factory(1, mode="loopback")
        assert tb.hosts[0].ssh_port != busy.getsockname()[1] and len(calls) == 2
        with connect(tb, tb.hosts[0]) as c:
            assert run(c, "true")[0] == 0
    finally:
        busy.close()


@pytest.mark.parametrize("mode", ["loopback", pytest.param("netns", marks=[pytest.mark.netns, requires_netns])])
def test_reap_stale_cleans_up_after_a_killed_owner(tmp_path, mode):
    owner = r"""
import json, os, signal, sys, paramiko
from tfcluster_testbed import Testbed
tb = Testbed(2, mode=sys.argv[2], base_dir=sys.argv[1]).start()
if tb.mode == "netns":
    tb.exec_on_host(tb.hosts[0], ["sh", "-c", "sleep 305 >/dev/null 2>&1 &"])
    tb.exec_on_host(tb.hosts[1], ["sh", "-c", "sleep 306 >/dev/null 2>&1 &"])
else:
    for h in tb.hosts:
        c = paramiko.SSHClient(); c.load_host_keys(str(tb.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(h.address, port=h.ssh_port, username=tb.user, key_filename=str(tb.user_key),
                  look_for_keys=False, allow_agent=False)
        c.exec_command("exec sleep 305")
print(json.dumps({"dir": str(tb.dir), "sshd": [tb.sshd_pid(h) for h in tb.hosts],
                  "netns": [h.netns for h in tb.hosts]}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no stop(), no atexit
"""
    p = subprocess.run(
        [sys.executable, "-c", owner, str(tmp_path), mode], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    info = json.loads(p.stdout)
    sshds = [psutil.Process(pid) for pid in info["sshd"]]
    tb_id = Path(info["dir"]).name.split("-")[2]

    def sleepers():
        return [
            pr
            for pr in psutil.process_iter(["name", "environ"])
            if pr.info["name"] == "sleep" and (pr.info["environ"] or {}).get(MARKER_ENV, "").startswith(tb_id + ":")
        ]

    try:
        found = wait_for(lambda: (lambda f: f if len(f) == 2 else None)(sleepers()), 10, "2 remote sleeps")
        assert Path(info["dir"]).exists() and all(not gone(s) for s in sshds)
        assert reap_stale(tmp_path) == [info["dir"]]
        assert all(gone(s) for s in sshds + found)
        assert not Path(info["dir"]).exists()
        assert all(not os.path.exists(f"/run/netns/{n}") for n in info["netns"] if n)
    finally:
        reap_stale(tmp_path)  # whatever happened above, leave nothing behind
    assert reap_stale(tmp_path) == []


def test_cli_entry_point(tmp_path):
    spec = tmp_path / "spec.yaml"
    argv = [sys.executable, "-m", "tfcluster_testbed", "--hosts", "2", "--mode", "loopback"]
    argv += ["--spec-out", str(spec), "--name", "cli-test", "--", "python3", "train.py"]
    p = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "host1" in text and "run the launcher" in text, text
        data = yaml.safe_load(spec.read_text())
        assert data["name"] == "cli-test" and data["job"]["command"] == ["python3", "train.py"]
        key_dir = Path(data["ssh"]["identity_file"]).parent
        assert key_dir.exists()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        assert not key_dir.exists()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------------------- netns


@pytest.mark.netns
@requires_netns
def test_netns_hosts_hostnames_ports_cut_restore(testbed_factory):
    links_before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    tb = testbed_factory(3, mode="netns")
    names = [h.netns for h in tb.hosts] + [tb.controller_netns, f"{tb.id}-br"]
    assert all(os.path.exists(f"/run/netns/{n}") for n in names)
    assert len({h.tf_port for h in tb.hosts}) == 1, "netns hosts look like a real cluster: one TF port"
    assert {h.ssh_port for h in tb.hosts} == {22}
    assert len({h.address for h in tb.hosts}) == 3
    assert tb.launcher_argv(["x"]) == ["ip", "netns", "exec", tb.controller_netns, "x"]
    assert all(len(n) <= 15 for n in (f"{tb.id}v{len(tb.hosts)}", f"{tb.id}vc"))
    assert tb.known_hosts.read_text().split()[0] == tb.hosts[0].address  # port 22: no [addr]:port

    res = ssh_from_controller(tb, "hostname")
    assert {n: r.get("out", r).strip() for n, r in res.items()} == {h.name: h.hostname for h in tb.hosts}
    assert len({h.hostname for h in tb.hosts}) == 3
    assert tb.exec_on_host(tb.hosts[2], ["hostname"]).stdout.strip() == tb.hosts[2].hostname

    tb.cut(tb.hosts[1])
    res = ssh_from_controller(tb, "true", timeout=1.5)
    assert "error" in res["host1"] and res["host0"]["rc"] == 0 and res["host2"]["rc"] == 0
    tb.restore(tb.hosts[1])
    res = ssh_from_controller(tb, "true", [tb.hosts[1]])
    assert res["host1"]["rc"] == 0

    tb.stop()
    assert not any(os.path.exists(f"/run/netns/{n}") for n in names)
    links_after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert tb.id not in links_after and links_after.count("\n") == links_before.count("\n")


@pytest.mark.netns
@requires_netns
def test_netns_two_testbeds_coexist_and_processes_in_namespace_are_ended(testbed_factory):
    a = testbed_factory(2, mode="netns")
    b = testbed_factory(2, mode="netns")
    assert a.id != b.id
    # A process started in a host namespace (not through sshd, no marker) is still "on" the host:
    sleeper = subprocess.Popen(["ip", "netns", "exec", b.hosts[0].netns, "sleep", "307"])
    try:
        wait_for(lambda: named(b.host_processes(b.hosts[0]), "sleep", "307"), 10, "sleep in namespace")
        assert named(a.host_processes(a.hosts[0]), "sleep", "307") == []
        res_a, res_b = ssh_from_controller(a, "hostname"), ssh_from_controller(b, "hostname")
        assert all(r.get("rc") == 0 for r in [*res_a.values(), *res_b.values()])
        a.stop()
        assert sleeper.poll() is None, "stopping one test bed must not touch the other"
        b.stop()
        assert sleeper.wait(timeout=5) is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.netns
@requires_netns
def test_netns_no_stdin_eof_through_a_cut_link(testbed_factory):
    """With the link cut, the client's FIN is lost: the remote process gets EOF only after restore."""
    tb = testbed_factory(1, mode="netns")
    eof_roundtrip(tb, cut=True)
