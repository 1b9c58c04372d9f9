"""The task's directory on the node (``NodeConfig.remote_dir``) and the files worker_entry keeps there.

Opened through ``safedir`` (every component checked, nothing followed that another user planted), as
is the BackupAndRestore directory (``TFCLUSTER_BACKUP_DIR``) the task will write: made this user's
before the command starts, so nobody else can put a link where TensorFlow writes. A path that is not
safe is a problem in the node's hello (``NodeFacts.problems``): the launcher stops the job before the
go, with the message and its fix; the task's lines still reach the launcher (no local log then).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from ..protocol.env import Env
from .safedir import UnsafePath, fix_hint, open_dir, open_file

LOG = "output.log"
EXIT = "exit.json"


class TaskDir:
    def __init__(self, remote_dir: str, env: dict[str, str], *, pod: bool = False) -> None:
        """``pod``: a Kubernetes pod's own filesystem (its emptyDir is mode 0777 by the kubelet's making,
        and only the pod's containers see it): no other user to defend against, nothing checked."""
        self.path = remote_dir
        self.fd: int | None = None
        self.problems: list[dict[str, str]] = []
        try:
            self.fd = _pod_dir(remote_dir) if pod else open_dir(remote_dir)
        except OSError as exc:
            self._problem("task_dir", f"task directory {remote_dir}: {_text(exc)}", "job.remote_dir")
        backup = env.get(Env.BACKUP_DIR)
        if backup and not pod:
            try:
                os.close(open_dir(backup))
            except OSError as exc:
                self._problem("backup_dir", f"backup directory {backup}: {_text(exc)}", "restart.backup_dir")

    def _problem(self, check: str, message: str, field: str) -> None:
        self.problems.append({"check": check, "message": message, "fix": fix_hint(field)})

    def open_log(self) -> int | None:
        """A descriptor for the task's own log (None: no safe directory, or it cannot be made)."""
        if self.fd is None:
            return None
        try:
            return open_file(self.fd, LOG)
        except OSError as exc:
            self._problem("task_dir", f"{os.path.join(self.path, LOG)}: {_text(exc)}", "job.remote_dir")
            return None

    def write_exit(self, status: dict[str, Any]) -> None:
        """exit.json, atomically (a temporary file created anew, then renamed), in the verified directory."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            fd = open_file(self.fd, EXIT + ".tmp", exclusive=True)
            with os.fdopen(fd, "w") as f:
                json.dump(status, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(EXIT + ".tmp", EXIT, src_dir_fd=self.fd, dst_dir_fd=self.fd)


def _pod_dir(path: str) -> int:
    os.makedirs(path, mode=0o700, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _text(exc: OSError) -> str:
    if isinstance(exc, UnsafePath):
        return str(exc)
    return f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
