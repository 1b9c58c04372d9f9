"""Redaction of credentials in what tfcluster prints and stores (plan, plan.json, spec.yaml, launcher.json).

What the nodes receive is never redacted; only copies meant for people and files are. Three rules:
a value under a name that looks like a credential, the password of a ``scheme://user:password@host``
URL anywhere, and the value after a credential-looking command-line flag (``--token X``,
``--api-key=X``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH|DSN|COOKIE|SESSION)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:)(?P<pw>[^/\s@]+)(?P<at>@)")
_FLAG = re.compile(r"^(?P<flag>-{1,2}[A-Za-z][A-Za-z0-9_.-]*)(?P<eq>=(?P<value>.*))?$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


def redact_urls(text: str) -> str:
    """``scheme://user:password@host`` → ``scheme://user:<redacted>@host``, wherever it appears."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("at"), text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide values whose names look like credentials, and passwords in URLs of the others."""
    return {k: (REDACTED if is_secret_name(k) and v else redact_urls(v)) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of credential flags (``--token X``, ``--password=X``) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _FLAG.match(arg)
        if m and is_secret_name(m.group("flag")):
            if m.group("eq") is not None:
                out.append(f"{m.group('flag')}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_urls(arg))
    return out


def secret_values(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """The literal values that ``redact_env``/``redact_argv`` hide (to redact a copy of the text)."""
    values = [v for k, v in env.items() if is_secret_name(k) and v]
    hide_next = False
    for arg in argv:
        if hide_next:
            values.append(arg)
            hide_next = False
            continue
        m = _FLAG.match(arg)
        if m and is_secret_name(m.group("flag")):
            if m.group("eq") is not None:
                values.append(m.group("value"))
            else:
                hide_next = True
    for text in [*env.values(), *argv]:
        values += [m.group("pw") for m in _URL_PASSWORD.finditer(text)]
    return sorted({v for v in values if v}, key=len, reverse=True)
