"""Errors raised at the edges, each carrying its Diagnostics. `cli` alone maps them to exit codes."""

from __future__ import annotations

from collections.abc import Sequence

from .diagnostics import Diagnostic


class TfclusterError(Exception):
    """Base of every error that is the user's to fix (never shown with a traceback)."""

    def __init__(self, message: str | Diagnostic | Sequence[Diagnostic]) -> None:
        if isinstance(message, Diagnostic):
            self.diagnostics: tuple[Diagnostic, ...] = (message,)
        elif isinstance(message, str):
            self.diagnostics = (Diagnostic(message),)
        else:
            self.diagnostics = tuple(message)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class UsageError(TfclusterError):
    """Bad command-line usage or a missing file."""


class SpecError(TfclusterError):
    """A cluster spec failed validation; carries every problem found, not only the first."""

    @property
    def problems(self) -> tuple[Diagnostic, ...]:
        return self.diagnostics


class ConnectError(TfclusterError):
    """One or more hosts could not be reached or authenticated: one error for all of them."""

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        super().__init__(diagnostics)
        self.args = (f"cannot reach {len(self.diagnostics)} host(s):\n" + str(self),)

    def __str__(self) -> str:
        lines = [f"cannot reach {len(self.diagnostics)} host(s):"]
        lines += ["  " + d.render().replace("\n", "\n  ") for d in self.diagnostics]
        return "\n".join(lines)


class PreflightError(TfclusterError):
    """Hosts are reachable but not fit to run the job (versions, ports, GPUs, ...)."""


class GatherError(TfclusterError):
    """Files could not be gathered or did not verify."""


class CheckRefused(TfclusterError):
    """`launch --check`: the check named hosts, GPUs or links and the spec does not allow leaving them out."""


class RunNotFound(UsageError):
    """A run directory or job name given to logs/status/stop does not exist."""
