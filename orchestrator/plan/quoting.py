"""Quoting for the one line a remote login shell runs. User data never goes through here."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def quote_arg(arg: str) -> str:
    """shlex.quote, but keep a leading ~/ expandable (a per-user interpreter like ~/venv/bin/python)."""
    if arg.startswith("~/") and len(arg) > 2:
        return "~/" + shlex.quote(arg[2:])
    return shlex.quote(arg)


def exec_line(argv: Sequence[str]) -> str:
    """`exec ARGV...`: the login shell replaces itself, so no extra process sits in between."""
    return "exec " + " ".join(quote_arg(a) for a in argv)
