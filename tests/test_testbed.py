"""The SSH test bed itself on loopback hosts: real sshd, real paramiko with RejectPolicy, no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import paramiko
import psutil
import pytest
import yaml
from waiting import wait_for

from tfcluster_testbed import (
    MARKER_ENV,
    Testbed,
    TestbedError,
    assert_no_leftovers,
    leftovers,
)

try:
    from testbed_fixtures import connect, testbed_factory
except ImportError:  # tests/ imported as a package
    from tests.testbed_fixtures import connect, testbed_factory
from testbed_probes import eof_roundtrip, gone, named, run

__all__ = ["testbed_factory"]  # re-exported fixture

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------------------------ loopback


def test_loopback_hosts_accept_key_auth(testbed_factory):
    tb = testbed_factory(3, mode="loopback")
    assert tb.mode == "loopback" and len(tb.hosts) == 3
    assert [h.address for h in tb.hosts] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert len({h.tf_port for h in tb.hosts}) == 3, "loopback hosts share a stack: TF ports must differ"
    assert not {h.tf_port for h in tb.hosts} & {h.ssh_port for h in tb.hosts}
    lines = tb.known_hosts.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == [f"[{h.address}]:{h.ssh_port}" for h in tb.hosts]
    for h in tb.hosts:
        with connect(tb, h) as c:
            rc, out = run(c, f"echo ${MARKER_ENV}; echo ${{SSH_CONNECTION}}")
            assert rc == 0
            marker, conn = out.splitlines()
            assert marker == tb.marker(h)
            assert conn.split()[2:] == [h.address, str(h.ssh_port)]
    assert leftovers(tb) == []


def test_wrong_or_unknown_host_key_is_rejected(testbed_factory, tmp_path):
    tb = testbed_factory(2, mode="loopback")
    h0, h1 = tb.hosts
    key1 = tb.known_hosts.read_text().splitlines()[1].split(None, 1)[1]
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"[{h0.address}]:{h0.ssh_port} {key1}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        connect(tb, h0, known_hosts=str(wrong))
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(tb, h0, known_hosts=str(empty))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    with pytest.raises(paramiko.AuthenticationException):  # a key not in authorized_keys
        connect(tb, h0, key_filename=str(tmp_path / "k"))
    with connect(tb, h1) as c:  # the right key still works
        assert run(c, "true")[0] == 0


def test_remote_process_is_tracked_and_ended_by_stop(testbed_factory):
    tb = testbed_factory(3, mode="loopback")
    h0, h1 = tb.hosts[:2]
    c = connect(tb, h0)
    try:
        c.exec_command("exec sleep 300")
        sleeper = wait_for(lambda: named(tb.host_processes(h0), "sleep", "300"), 10, "sleep on host0")[0]
        assert named(tb.host_processes(h1), "sleep", "300") == []
        assert sleeper.pid not in {p.pid for p in tb.host_processes(h1)}
        listener = psutil.Process(tb.sshd_pid(h0))
        assert listener.pid not in {p.pid for p in tb.host_processes(h0)}
        assert any("sleep" in x for x in leftovers(tb))
        tb_dir = tb.dir
        tb.stop()
        assert gone(sleeper) and gone(listener)
        assert not tb_dir.exists()
        assert_no_leftovers(tb, timeout=0)
        tb.stop()  # idempotent
        assert tb.host_processes(h0) == []
        with pytest.raises(TestbedError):
            tb.exec_on_host(h0, ["true"])
    finally:
        c.close()


def test_escaped_process_is_found_by_env_marker(testbed_factory):
    tb = testbed_factory(2, mode="loopback")
    h = tb.hosts[1]
    with connect(tb, h) as c:
        # Daemonized: setsid + background, the shell exits, sleep is re-parented to PID 1.
        assert run(c, "setsid sleep 301 </dev/null >/dev/null 2>&1 & echo started")[1].strip() == "started"
    sleeper = wait_for(lambda: named(tb.host_processes(h), "sleep", "301"), 10, "daemonized sleep")[0]
    assert sleeper.ppid() != tb.sshd_pid(h)
    assert sleeper.environ()[MARKER_ENV] == tb.marker(h)
    tb.stop()
    assert gone(sleeper)


def test_stop_kills_processes_that_ignore_sigterm(testbed_factory):
    tb = testbed_factory(1, mode="loopback", grace_s=0.3)
    h = tb.hosts[0]
    with connect(tb, h) as c:
        c.exec_command("trap '' TERM; sleep 309 & sleep 310 & wait")  # children inherit the ignored TERM
        procs = wait_for(
            lambda: (lambda f: f if len(f) == 2 else None)(
                named(tb.host_processes(h), "sleep", "309") + named(tb.host_processes(h), "sleep", "310")
            ),
            10,
            "two sleeps",
        )
        t = time.monotonic()
        tb.stop()
        assert time.monotonic() - t < 3
        assert all(gone(p) for p in procs)
        assert any("sleep 309" in desc for _, _, desc in tb.killed)


def test_stop_twice_and_context_manager_leave_nothing(tmp_path):
    with Testbed(2, mode="loopback", base_dir=tmp_path) as tb:
        listeners = [psutil.Process(tb.sshd_pid(h)) for h in tb.hosts]
        tb_dir = tb.dir
        assert tb_dir.parent == tmp_path.resolve() and (tb_dir / "state.json").exists()
    tb.stop()
    tb.stop()
    assert all(gone(p) for p in listeners)
    assert not tb_dir.exists() and list(tmp_path.iterdir()) == []
    assert tb.stop_errors == []
    assert_no_leftovers(tb, timeout=0)
    with pytest.raises(TestbedError):
        tb.start()


def test_kill_sshd_leaves_user_process_and_restart_sshd(testbed_factory):
    tb = testbed_factory(2, mode="loopback")
    h = tb.hosts[0]
    c = connect(tb, h)
    try:
        c.exec_command("exec sleep 302")
        wait_for(lambda: named(tb.host_processes(h), "sleep", "302"), 10, "sleep")
        listener = psutil.Process(tb.sshd_pid(h))
        session = [p for p in tb.host_processes(h) if p.name() == "sshd"]
        survivors = tb.kill_sshd(h)
        assert [p.cmdline() for p in survivors] == [["sleep", "302"]]
        assert tb.sshd_pid(h) is None and all(gone(p) for p in [listener, *session])
        with pytest.raises((paramiko.ssh_exception.NoValidConnectionsError, OSError)):
            connect(tb, h, timeout=2)
        # Orphaned by its dead sshd, still "on" the host:
        assert [p.pid for p in named(tb.host_processes(h), "sleep", "302")] == [survivors[0].pid]
        tb.restart_sshd(h)
        with connect(tb, h) as c2:
            assert run(c2, "echo ok")[1] == "ok\n"
        tb.stop()
        assert gone(survivors[0])
    finally:
        c.close()


def test_single_sshd_serves_many_addresses(testbed_factory):
    tb = testbed_factory(20, mode="loopback", single_sshd=True)
    pids = {tb.sshd_pid(h) for h in tb.hosts}
    assert len(pids) == 2, "one sshd per 16 addresses (OpenSSH's MAX_LISTEN_SOCKS)"
    assert len({ln.split()[-1] for ln in tb.known_hosts.read_text().splitlines()}) == 1  # one host key
    a, b = tb.hosts[0], tb.hosts[17]
    ca, cb = connect(tb, a), connect(tb, b)
    try:
        assert run(cb, f"echo ${MARKER_ENV}")[1].strip() == tb.marker(b)  # Match LocalAddress
        ca.exec_command("exec sleep 303")
        cb.exec_command("exec sleep 304")
        wait_for(lambda: named(tb.host_processes(a), "sleep", "303"), 10, "sleep on a")
        wait_for(lambda: named(tb.host_processes(b), "sleep", "304"), 10, "sleep on b")
        assert named(tb.host_processes(a), "sleep", "304") == []
        assert named(tb.host_processes(b), "sleep", "303") == []
        assert tb.host_processes(tb.hosts[1]) == []
    finally:
        ca.close()
        cb.close()


def test_spec_dict_and_write_spec(testbed_factory, tmp_path):
    tb = testbed_factory(2, mode="loopback")
    spec = tb.spec_dict("demo-1", ["python3", "train.py"], heartbeat={"interval_s": 1}, job={"workdir": "/tmp/x"})
    assert spec["version"] == 1 and spec["name"] == "demo-1"
    assert spec["ssh"] == {"user": tb.user, "identity_file": str(tb.user_key), "known_hosts": str(tb.known_hosts)}
    assert spec["hosts"] == [{"address": h.address, "port": h.ssh_port, "tf_port": h.tf_port} for h in tb.hosts]
    python = os.environ.get("TFCLUSTER_TESTBED_PYTHON") or sys.executable  # conftest: this checkout's
    assert spec["job"] == {
        "command": ["python3", "train.py"],
        "python": python,
        "workdir": "/tmp/x",
        "remote_dir": str(tb.dir / "remote"),
    }  # the tasks' directories go with the bed
    assert spec["heartbeat"] == {"interval_s": 1}
    path = tb.write_spec(tmp_path / "c.yaml", "demo", ["true"])
    assert yaml.safe_load(path.read_text()) == tb.spec_dict("demo", ["true"])
    with pytest.raises(ValueError):
        tb.spec_dict("Bad_Name", ["true"])


def test_stdin_eof_reaches_remote_process_when_client_is_killed(testbed_factory):
    """Fact check for the launcher: SIGKILL of the client holding the connection closes the TCP
    connection (the kernel sends FIN), sshd exits and the remote process reads EOF on stdin."""
    tb = testbed_factory(1, mode="loopback")
    eof_roundtrip(tb, cut=False)
