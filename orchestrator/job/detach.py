"""`tfcluster launch --detach`: the launcher runs on in the background, with no terminal.

The foreground process validates the spec and plans (so mistakes are reported here, exit 2),
creates the run directory, and starts the real launcher in its own session (no controlling
terminal: closing this shell sends it nothing) with stdin from /dev/null and its output in
RUN/launcher.log. It returns once that launcher has written launcher.json — then `tfcluster logs
RUN --follow`, `status RUN` and `stop RUN` work as for any run — or with the launcher's own exit
code if it ended before that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from ..core.errors import UsageError
from ..runs import RunDir

STARTUP_WAIT_S = 30.0


def launch_detached(spec: str, run_dir: str, run_id: str, child_args: Sequence[str]) -> tuple[int, str]:
    """(exit code, message): 0 and where it runs, or the early launcher's exit code and its output. The
    background launcher plans with this process's ``run_id``: one run, one id (its nodes' directories,
    TFCLUSTER_RUN_ID, plan.json)."""
    rundir = RunDir.create(run_dir)
    log = os.open(rundir.launcher_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "launch",
        spec,
        "--run-dir",
        run_dir,
        "--detached-child",
        "--detached-run-id",
        run_id,
        *child_args,
    ]
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
    except OSError as exc:
        raise UsageError(f"cannot start the launcher in the background: {exc.strerror or exc}") from None
    finally:
        os.close(log)
    deadline = time.monotonic() + STARTUP_WAIT_S
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = _tail(rundir)
            return code, f"the launcher ended at once (exit {code}); {rundir.launcher_log}:\n{tail}"
        if rundir.launcher_json.exists():
            break
        time.sleep(0.05)
    return 0, (
        f"launched in the background (pid {proc.pid}); run directory {rundir.path} (run id {run_id})\n"
        f"  tfcluster logs {rundir.path} --follow\n"
        f"  tfcluster status {rundir.path}\n"
        f"  tfcluster stop {rundir.path}"
    )


def _tail(rundir: RunDir, lines: int = 20) -> str:
    try:
        text = rundir.launcher_log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
