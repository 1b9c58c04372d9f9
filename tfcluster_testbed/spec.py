"""The cluster spec (tfcluster's YAML input) that describes a test bed's hosts.

Built here as a plain dict, not through orchestrator's spec model: the test bed must keep
working while the code under test is broken.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import TestHost

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: job.python for the hosts when set: e.g. a wrapper that puts the checkout under test first on
#: PYTHONPATH (the hosts start ``PYTHON -m worker_entry`` from the login directory, where an
#: editable install of another checkout would win).
PYTHON_ENV = "TFCLUSTER_TESTBED_PYTHON"


def _deep_merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged over it, recursing into dicts (so callers override single keys)."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _spec_dict(
    name: str,
    command: Sequence[str],
    *,
    user: str,
    user_key: Path,
    known_hosts: Path,
    hosts: Sequence[TestHost],
    sections: dict[str, Any],
) -> dict:
    """A cluster spec for `hosts` with `sections` deep-merged over the defaults; job.python is
    this interpreter so worker_entry imports (or $TFCLUSTER_TESTBED_PYTHON)."""
    if not _NAME_RE.match(name):
        raise ValueError(f"spec name {name!r}: lowercase letters, digits and '-' only")
    entries = []
    for h in hosts:
        entry: dict[str, Any] = {"address": h.address}
        if h.ssh_port != 22:
            entry["port"] = h.ssh_port
        entry["tf_port"] = h.tf_port
        entries.append(entry)
    spec: dict[str, Any] = {
        "version": 1,
        "name": name,
        "ssh": {
            "user": user,
            "identity_file": str(user_key),
            "known_hosts": str(known_hosts),
        },
        "hosts": entries,
        "job": {"command": list(command), "python": os.environ.get(PYTHON_ENV) or sys.executable},
    }
    return _deep_merge(spec, sections)


def ssh_client_argv(h: TestHost, user: str, key: Path, known_hosts: Path, command: Sequence[str] = ()) -> list[str]:
    """An OpenSSH client command line for ``h`` as ``user`` with the test bed's ``key``, strict host key
    checking against ``known_hosts``."""
    return [
        "ssh",
        "-i",
        str(key),
        "-p",
        str(h.ssh_port),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        f"{user}@{h.address}",
        *command,
    ]
