"""Where one host's launch time goes, on an idle test bed (``launch_fanout.py``'s component table): an
SSH connection with key exchange and auth, exec of `true` (sshd's fork and login shell), the login
shell alone, the interpreter's start, `worker_entry --version`, and the node facts of its hello."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, median


def local_login_shell_ms() -> float:
    env = dict(os.environ, SSH_CLIENT="127.0.0.1 40000 22")
    env.pop("SHLVL", None)
    ts = []
    for _ in range(5):
        t = time.monotonic()
        subprocess.run(["bash", "-c", "true"], env=env, check=True)
        ts.append(time.monotonic() - t)
    return 1000 * median(ts)


def component_costs(tb) -> list[dict]:
    """Single-host costs, sequential, on an idle bed: where one host's launch time goes."""
    import paramiko

    h = tb.hosts[0]
    rows = []
    c = paramiko.SSHClient()
    c.load_host_keys(str(tb.known_hosts))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    key = paramiko.PKey.from_path(str(tb.user_key))
    times = []
    for _ in range(5):
        t = time.monotonic()
        c.connect(h.address, port=h.ssh_port, username=tb.user, pkey=key, look_for_keys=False, allow_agent=False)
        times.append(time.monotonic() - t)
        c.close()
        c = paramiko.SSHClient()
        c.load_host_keys(str(tb.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
    rows.append({"what": "paramiko connect + key exchange + auth", "ms": 1000 * median(times)})
    c.connect(h.address, port=h.ssh_port, username=tb.user, pkey=key, look_for_keys=False, allow_agent=False)

    def ex(cmd: str) -> float:
        ts = []
        for _ in range(5):
            t = time.monotonic()
            _, out, _ = c.exec_command(cmd)
            out.read()
            out.channel.recv_exit_status()
            ts.append(time.monotonic() - t)
        return 1000 * median(ts)

    t_true = ex("true")
    t_norc = local_login_shell_ms()
    t_py = ex(f"exec {PY} -c pass")
    t_we = ex(f"exec {PY} -m worker_entry --version")
    facts = ex(
        f"exec {PY} -c 'import time; t=time.perf_counter(); from worker_entry.agent.sysinfo import node_facts, Nvml; "
        f"node_facts({{}}, Nvml()); print(time.perf_counter()-t)'"
    )
    _, out, _ = c.exec_command(
        f"exec {PY} -c 'import time; t=time.perf_counter(); from worker_entry.agent.sysinfo import node_facts, Nvml; "
        f"node_facts({{}}, Nvml()); print(time.perf_counter()-t)'"
    )
    nf = float(out.read().decode().strip() or "nan") * 1000
    c.close()
    rows += [
        {"what": "exec `true` on an open connection (sshd fork + login shell)", "ms": t_true},
        {"what": "  login shell with ~/.bashrc, locally (`bash -c true` as sshd runs it)", "ms": t_norc},
        {"what": "exec python -c pass (interpreter start)", "ms": t_py},
        {"what": "exec python -m worker_entry --version", "ms": t_we},
        {"what": "  node_facts() in worker_entry's hello (in-process)", "ms": nf},
        {"what": "exec python: import worker_entry.agent.sysinfo + node_facts", "ms": facts},
    ]
    return rows
