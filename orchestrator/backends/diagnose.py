"""Why worker_entry did not start on a node, or died there, from its exit status and stderr (the one
place that says)."""

from __future__ import annotations

from ..core.diagnostics import Diagnostic


def entry_failure(status: int | None, stderr: str, python: str, *, synced: bool = False) -> Diagnostic | None:
    """The diagnosis when ``python -m worker_entry`` could not run: interpreter missing, or tfcluster not
    installed for it. None when the text shows neither (``synced``: worker_entry already spoke)."""
    if "No module named worker_entry" in stderr or "No module named 'worker_entry'" in stderr:
        return Diagnostic(
            f"tfcluster is not installed for {python} on the host",
            f"pip install tfcluster there (into the environment of {python}), or point job.python at "
            "the interpreter that has it",
            code="not_installed",
        )
    missing = status == 127 or "command not found" in stderr or ("No such file" in stderr and not synced)
    if missing:
        return Diagnostic(
            f"cannot run {python!r} on the host (exit {status})",
            "set job.python to the interpreter's full path on the hosts (e.g. /opt/venv/bin/python)",
            code="interpreter",
        )
    return None


def agent_crash(status: int | None, stderr: str) -> Diagnostic | None:
    """worker_entry itself raised on the node (a tfcluster bug, not the host's failure nor the script's:
    the training process's output never reaches this stderr): the diagnosis, or None. The host answered
    with an exit status (ssh's own failures are 255), so it is up and reachable; it must not be blamed
    and left out of the run as a lost host would be."""
    if status is None or status == 255 or "Traceback (most recent call last)" not in stderr:
        return None
    if "worker_entry" not in stderr:
        return None
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1][:300] if lines else ""
    return Diagnostic(
        f"worker_entry failed on the host (exit {status}): {last}",
        "a tfcluster bug, not your script's: the traceback is in the task's log; please report it",
        code="agent",
    )
