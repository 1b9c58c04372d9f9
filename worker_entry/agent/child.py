"""The training process: started in its own session and process group, killed with everything it left.

``PR_SET_PDEATHSIG`` makes the kernel kill it if worker_entry dies (even by SIGKILL); ``kill_group``
signals the whole group; ``kill_escaped`` reaches descendants that left the group (setsid, daemons),
by PID and start time so a recycled PID is never hit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from .. import protocol as p
from ..protocol.env import ENV_STRING_MAX

#: The instrumentation's bootstrap (``worker_entry/_site/sitecustomize.py``), first on the training
#: process's PYTHONPATH. A path, not an import: the agent never imports the instrumentation.
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_site")


def _pdeathsig_preexec() -> Any:
    """A preexec_fn that makes the kernel SIGKILL the child if worker_entry dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except Exception:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def child_env(config: p.NodeConfig, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The training command's environment: ours, the plan's, the task's TF_CONFIG (built here from the
    config's cluster: the plan sends the cluster once, never a TF_CONFIG per task), expanded paths, the
    instrumentation."""
    env = dict(base)
    env.update(config.env)
    tf_config = config.tf_config_json()
    in_file = tf_config is not None and len(p.Env.TF_CONFIG) + len(tf_config) + 2 > ENV_STRING_MAX
    if in_file:  # ~6,000 tasks and more: no execve takes it; the bootstrap sets it in the new interpreter
        env[p.Env.TF_CONFIG_FILE] = _tf_config_file(config, tf_config)  # type: ignore[arg-type]
    elif tf_config is not None:
        env[p.Env.TF_CONFIG] = tf_config
    for key in p.PATH_VARS:
        if key in env:
            env[key] = os.path.expanduser(env[key])
    if config.instrument or in_file:
        env["PYTHONPATH"] = SITE_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _tf_config_file(config: p.NodeConfig, tf_config: str) -> str:
    """The task's TF_CONFIG in its directory (0600), for ``sitecustomize`` to put into ``os.environ``."""
    folder = os.path.expanduser(config.remote_dir)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, "tf_config.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(tf_config)
    return path


def spawn(config: p.NodeConfig, progress_fd: int) -> subprocess.Popen:
    """Start the command with stdout/stderr piped and ``progress_fd`` passed for progress records."""
    env = child_env(config)
    env[p.Env.PROGRESS_FD] = str(progress_fd)
    return subprocess.Popen(
        config.argv,
        cwd=os.path.expanduser(config.workdir) if config.workdir else None,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # own session and process group: we can signal all of it
        pass_fds=(progress_fd,),
        preexec_fn=_pdeathsig_preexec(),
        bufsize=0,
    )


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_escaped(seen: Mapping[int, float]) -> None:
    """SIGKILL descendants that left the process group, by PID + start time (``seen``: pid -> ctime)."""
    if not seen:
        return
    try:
        import psutil  # only here: a task with nothing left to reach needs none
    except ImportError:  # pragma: no cover - psutil is a dependency, but the node may lack it
        return
    for pid, created in list(seen.items()):
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01:
                proc.kill()
        except Exception:
            continue


def alive_in_group(pgid: int) -> list[int]:
    """PIDs of the group's processes that are not yet dead (a zombie is dead: it only waits for its
    reaper, which may be a container's PID 1 that never reaps)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    alive = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            alive.append(int(name))
    return alive


def alive_escaped(seen: Mapping[int, float]) -> list[int]:
    """Descendants that left the group (``seen``: pid -> start time) and still run."""
    if not seen:
        return []
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return []
    alive = []
    for pid, created in list(seen.items()):
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except Exception:
            continue
    return alive


def wait_gone(pgid: int, seen: Mapping[int, float], timeout_s: float) -> list[int]:
    """After SIGKILL: wait (bounded) until nothing of the task runs; the PIDs still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = alive_in_group(pgid) + alive_escaped(seen)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def spawn_error(config: p.NodeConfig, exc: OSError) -> tuple[int, str]:
    """(exit code, message) when the command could not be started, as a shell would say it."""
    what = config.argv[0]
    if isinstance(exc, FileNotFoundError):
        return 127, f"worker_entry: command not found or workdir missing: {what!r} ({exc.strerror})"
    return 126, f"worker_entry: cannot start {what!r}: {exc.strerror or exc}"


def signal_name(sig: int | None) -> str | None:
    return signal.Signals(sig).name if sig else None
