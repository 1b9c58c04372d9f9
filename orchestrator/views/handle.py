"""A run seen from outside its supervisor: is it alive, what its scheduler says, how to stop it.

``RunHandle`` is the default: the supervisor is the launcher process recorded in launcher.json (pid
and start time, so a recycled pid is never taken for it) on this machine — a launch over SSH, on
Kubernetes, or inside a Slurm allocation. A scheduler whose supervisor lives elsewhere (a Slurm batch
job) or that leaves objects behind (Kubernetes) gives its own handle (``orchestrator/schedulers``);
``status``, ``stop`` and ``logs --follow`` only ever talk to a handle.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ..core.errors import UsageError
from ..runs import RunDir

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


class RunHandle:
    def __init__(self, run: RunDir) -> None:
        self.run = run

    # --- what status shows -----------------------------------------------------------------------

    def settle(self) -> None:
        """Before the run is read: end a run nobody will end any more (default: nothing to do)."""
        return None

    def scheduler_status(self) -> dict[str, Any]:
        """Sections ``status --json`` adds for the scheduler (e.g. ``{"slurm": {...}}``)."""
        return {}

    def scheduler_lines(self, status: dict[str, Any]) -> list[str]:
        """The same, as lines under the status header."""
        return []

    def detail_lines(self, status: dict[str, Any]) -> list[str]:
        """Lines after the task table (e.g. the pods of every attempt)."""
        return []

    def queued(self, status: dict[str, Any]) -> bool:
        """The run waits for the scheduler to start it."""
        return False

    def gone_message(self, status: dict[str, Any]) -> str:
        """What to say when the supervisor is gone without a result.json."""
        return (
            "the launcher is not running and wrote no result.json: it was killed (SIGKILL) or its machine "
            "went away. Its workers stop by themselves when the launcher stops answering; "
            f"last known state: {status.get('state', 'unknown')}"
        )

    # --- the supervisor --------------------------------------------------------------------------

    def launcher(self) -> Any:
        """The launcher's process, or None (not running, or the pid was recycled)."""
        info = self.run.read_json(self.run.launcher_json) or {}
        pid = info.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or psutil is None:
            return None
        try:
            p = psutil.Process(pid)
            created = info.get("create_time")
            if created is not None and abs(p.create_time() - created) > 0.05:
                return None  # the pid was recycled by another process
            return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def alive(self) -> bool:
        p = self.launcher()
        if p is None:
            return False
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    # --- stop ------------------------------------------------------------------------------------

    def check_owner(self) -> int:
        """The run directory's owner, when it is us (or we are root); else a UsageError."""
        owner = os.stat(self.run.path).st_uid
        if owner != os.getuid() and os.getuid() != 0:
            raise UsageError(f"{self.run.path} belongs to uid {owner}; only the user who started the job can stop it")
        return owner

    def stop(self, timeout_s: float) -> str:
        """The launcher's own clean teardown (SIGTERM, like Ctrl-C), then wait for its result."""
        if self.run.is_finished():
            return already_finished(self.run)
        owner = self.check_owner()
        proc = self.launcher()
        if proc is None:
            return self.stop_without_launcher()
        try:
            # launcher.json is only a file: whoever could write it could name any process. Even as root,
            # signal only a tfcluster launcher owned by the run directory's owner.
            why = _not_our_launcher(proc, owner)
            if why:
                raise UsageError(f"refusing to signal pid {proc.pid}: {why}")
            self.before_signal()
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            return "the launcher exited just now"
        except psutil.AccessDenied:
            raise UsageError(
                "not allowed to signal the launcher; only the user who started the job can stop it"
            ) from None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.run.is_finished():
                return stopped_text(self.run.read_json(self.run.result_json) or {})
            if not self.alive():
                return "the launcher exited without writing result.json"
            time.sleep(0.2)
        raise UsageError(f"the launcher did not finish its teardown within {timeout_s:g}s (pid {proc.pid})")

    def before_signal(self) -> None:
        """Just before the launcher gets SIGTERM (a scheduler may need to know it is a user's stop)."""
        return None

    def stop_without_launcher(self) -> str:
        return "the launcher is not running (no result.json either: it was killed); its workers stop by themselves"


def already_finished(run: RunDir) -> str:
    """What ``stop`` says of a run that has a result.json (read as untrusted: any damage is said)."""
    result = run.read_json(run.result_json)
    state = result.get("state") if isinstance(result, dict) else None
    return f"the job already finished: {state if isinstance(state, str) else '(result.json damaged)'}"


def stopped_text(result: Any) -> str:
    result = result if isinstance(result, dict) else {}
    tasks = result.get("tasks") if isinstance(result.get("tasks"), dict) else {}
    states = ", ".join(f"{k}: {v.get('state')}" for k, v in sorted(tasks.items()) if isinstance(v, dict))
    return f"stopped: job {result.get('state')}" + (f" ({states})" if states else "")


def _not_our_launcher(proc: Any, owner: int) -> str | None:
    """Why ``proc`` is not the launcher of a run owned by ``owner`` (None when it is)."""
    if proc.uids().real != owner:
        return f"it belongs to uid {proc.uids().real}, the run directory to uid {owner}"
    argv = proc.cmdline()
    names = {os.path.basename(a) for a in argv[:3]}
    is_tfcluster = "tfcluster" in names or any(a == "orchestrator" for a in argv[1:3])
    if not (is_tfcluster and "launch" in argv):
        return f"it is not a tfcluster launcher ({' '.join(argv)[:80]!r})"
    return None
