"""Redaction for plans (see core/redact.py: the rules live there, shared with the run directory)."""

from __future__ import annotations

from ..core.redact import REDACTED, SECRET_NAME_RE, redact_argv, redact_env, redact_text

__all__ = ["REDACTED", "SECRET_NAME_RE", "redact_argv", "redact_env", "redact_path", "redact_text"]


def redact_path(value: str | None, show_secrets: bool = False) -> str | None:
    """A directory or URL of the spec with its credentials hidden (``s3://KEY:SECRET@bucket``), unless
    ``show_secrets``."""
    return redact_text(value) if value and not show_secrets else value
