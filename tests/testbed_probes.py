"""What the test-bed tests probe a host with: a command over SSH, processes by name, whether one has
ended, and stdin EOF across a killed client (optionally through a cut link)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import psutil
from waiting import wait_for

from tfcluster_testbed import (
    Testbed,
)

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
