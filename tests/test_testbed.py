"""The SSH test bed itself: real sshd, real paramiko with RejectPolicy, no mocks."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
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
    leftovers,
    reap_stale,
)

try:
    from testbed_fixtures import connect, requires_netns, ssh_from_controller, testbed_factory
except ImportError:  # tests/ imported as a package
    from tests.testbed_fixtures import connect, requires_netns, ssh_from_controller, testbed_factory

__all__ = ["testbed_factory"]  # re-exported fixture

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, out, _ = client.exec_command(command, timeout=30)
    text = out.read().decode()
    return out.channel.recv_exit_status(), text


def named(procs: list[psutil.Process], name: str, *args: str) -> list[psutil.Process]:
    """Processes named `name` (and, when given, with exactly these arguments). Note that root's
    .bashrc here runs short-lived commands (pyenv init: `sleep 0.1`) in every SSH session."""
    out = []
    for p in procs:
        try:
            if p.name() == name and (not args or p.cmdline()[1:] == list(args)):
                out.append(p)
        except psutil.Error:
            pass
    return out


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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


def eof_roundtrip(tb: Testbed, cut: bool) -> None:
    h = tb.hosts[0]
    flag = tb.dir / "eof-flag"
    prog = f"import sys; sys.stdin.read(); open({str(flag)!r}, 'w')"
    client = r"""
import json, sys, time, paramiko
a = json.loads(sys.argv[1])
c = paramiko.SSHClient(); c.load_host_keys(a["kh"]); c.set_missing_host_key_policy(paramiko.RejectPolicy())
c.connect(a["addr"], port=a["port"], username=a["user"], key_filename=a["key"], look_for_keys=False, allow_agent=False)
c.get_transport().open_session().exec_command(a["cmd"])
print("started", flush=True)
time.sleep(600)
"""
    args = dict(
        addr=h.address,
        port=h.ssh_port,
        user=tb.user,
        key=str(tb.user_key),
        kh=str(tb.known_hosts),
        cmd=shlex.join([sys.executable, "-c", prog]),
    )
    p = tb.run_on_controller([sys.executable, "-c", client, json.dumps(args)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    remote = wait_for(
        lambda: [x for x in named(tb.host_processes(h), Path(sys.executable).name) if "stdin" in str(x.cmdline())],
        10,
        "remote reader",
    )[0]
    if cut:
        tb.cut(h)
    p.send_signal(signal.SIGKILL)
    p.wait()
    if cut:
        time.sleep(1.5)
        assert not flag.exists(), "EOF arrived through a cut link?"
        assert not gone(remote)
        tb.restore(h)  # the client kernel's FIN retransmission now gets through
    wait_for(flag.exists, 20, "EOF on the remote stdin")  # seconds of slack on a loaded machine
    wait_for(lambda: gone(remote), 20, "remote reader exit")


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
