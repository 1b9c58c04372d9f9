"""Redaction for plans (see core/redact.py: the rules live there, shared with the run directory)."""

from __future__ import annotations

from ..core.redact import REDACTED, SECRET_NAME_RE, redact_argv, redact_env

__all__ = ["REDACTED", "SECRET_NAME_RE", "redact_argv", "redact_env"]
