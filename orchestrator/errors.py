"""Error types raised at the edges. `cli.py` is the only place that maps them to exit codes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a cluster spec, located so the user can fix it without searching."""

    file: str
    line: int | None
    path: str
    message: str
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}: {self.path}: {tag}{self.message}"

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "path": self.path,
            "message": self.message,
            "severity": self.severity,
        }


class TfclusterError(Exception):
    """Base of every error that is the user's to fix (never shown with a traceback)."""


class UsageError(TfclusterError):
    """Bad command-line usage or a missing file."""


class SpecError(TfclusterError):
    """A cluster spec failed validation; carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class ConnectError(TfclusterError):
    """One or more hosts could not be reached or authenticated; one message for all of them."""

    def __init__(self, failures: list[tuple[str, str]]):
        self.failures = failures  # (host label, "what failed — what to try")
        lines = [f"cannot reach {len(failures)} host(s):"] + [f"  {h}: {msg}" for h, msg in failures]
        super().__init__("\n".join(lines))


class PreflightError(TfclusterError):
    """Hosts are reachable but not fit to run the job (versions, ports, GPUs, ...)."""


class GatherError(TfclusterError):
    """Files could not be gathered or did not verify."""


class RunNotFound(UsageError):
    """A run directory or job name given to logs/status/stop does not exist."""
