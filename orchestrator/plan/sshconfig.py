"""Read ~/.ssh/config once, so the plan can honour HostName/User/Port/IdentityFile/ProxyCommand."""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import paramiko

from .build import SshLookup


def local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): fall back to the uid
        return str(os.getuid())


def ssh_config_lookup(config_file: str | None) -> SshLookup | None:
    """A lookup function over an OpenSSH client config, or None when there is none to honour."""
    if not config_file:
        return None
    path = Path(config_file).expanduser()
    if not path.is_file():
        return None
    try:
        cfg = paramiko.SSHConfig.from_path(str(path))
    except Exception:
        return None

    def lookup(host: str) -> Mapping[str, Any]:
        found = cfg.lookup(host)
        # paramiko fills hostname with the alias itself when unset; keep only what the file said.
        return {k: v for k, v in found.items() if k in ("hostname", "user", "port", "identityfile", "proxycommand")}

    return lookup
