"""One shape for everything a user reads about a failure: what failed, how to fix it, where.

Spec problems (``FILE:LINE: field: message``), unreachable hosts, preflight findings, problems a
node reports about itself and a job's root cause are all ``Diagnostic``s, rendered once for the
console (``render``) and once for ``--json`` (``to_dict``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .terminal import safe_text

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Diagnostic:
    message: str  # what failed
    hint: str = ""  # what to do about it
    task: str | None = None  # worker:1
    host: str | None = None  # the spec address
    code: str = ""  # machine-readable kind: host_key_unknown, tf_port, protocol, spec, ...
    severity: Severity = "error"
    file: str | None = None  # spec problems: where in which file
    line: int | None = None
    field: str | None = None  # hosts[1].gpus

    @classmethod
    def at(
        cls, file: str, line: int | None, field: str, message: str, severity: Severity = "error", hint: str = ""
    ) -> Diagnostic:
        """A problem located in a file (a cluster spec)."""
        return cls(message, hint, code="spec", severity=severity, file=file, line=line, field=field)

    @property
    def blocks(self) -> bool:
        return self.severity == "error"

    @property
    def where(self) -> str:
        if self.file is not None:
            loc = f"{self.file}:{self.line}" if self.line else self.file
            return f"{loc}: {self.field}" if self.field else loc
        if self.task and self.host:
            return f"{self.task} ({self.host})"
        return self.task or self.host or ""

    def render(self) -> str:
        """Console form: ``WHERE: [warning: ]message`` and, when there is one, ``  fix: hint``."""
        tag = f"{self.severity}: " if self.severity != "error" else ""
        head = f"{self.where}: {tag}{self.message}" if self.where else f"{tag}{self.message}"
        # a spec's own keys, values and file name are quoted here: nothing in them drives the terminal
        return safe_text(head + (f"\n  fix: {self.hint}" if self.hint else ""))

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnostic:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def render_all(diagnostics: Iterable[Diagnostic]) -> str:
    return "\n".join(d.render() for d in diagnostics)
