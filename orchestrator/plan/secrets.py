"""Redaction of credentials in what tfcluster prints and stores (plan, plan.json, events)."""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH)", re.IGNORECASE)
REDACTED = "<redacted>"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide values whose names look like credentials (API keys, tokens, passwords)."""
    return {k: (REDACTED if SECRET_NAME_RE.search(k) and v else v) for k, v in env.items()}
