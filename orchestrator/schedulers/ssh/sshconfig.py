"""Read the OpenSSH client config (~/.ssh/config) the way ssh does, for the options tfcluster honours.

Why our own reader: paramiko's has no ``Include``, expands tokens before the spec's overrides apply,
knows nothing of ``ProxyJump`` (the launcher then silently bypassed the bastion) and imports
``invoke``. Semantics follow ssh_config(5): ``Host`` and ``Match`` blocks, the first value obtained
for an option wins (``IdentityFile`` accumulates), ``Include`` with globs relative to ~/.ssh,
``keyword value`` or ``keyword=value``, quoted arguments. Every option a host's blocks set that
tfcluster does not honour is reported (a warning in the plan), never silently dropped.
"""

from __future__ import annotations

import errno
import fnmatch
import getpass
import glob
import os
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Options that decide where and how we connect (the rest are reported as ignored).
HONOURED = frozenset(
    {
        "hostname",
        "user",
        "port",
        "identityfile",
        "proxycommand",
        "proxyjump",
        "userknownhostsfile",
        "connecttimeout",
        "serveraliveinterval",
    }
)
#: Options that change nothing for a non-interactive launcher that verifies host keys anyway.
HARMLESS = frozenset(
    {
        "loglevel",
        "serveralivecountmax",
        "tcpkeepalive",
        "hashknownhosts",
        "identitiesonly",
        "addressfamily",
        "visualhostkey",
        "updatehostkeys",
        "stricthostkeychecking",
        "checkhostip",
        "batchmode",
        "addkeystoagent",
        "preferredauthentications",
        "pubkeyauthentication",
        "passwordauthentication",
        "kbdinteractiveauthentication",
        "gssapiauthentication",
        "requesttty",
        "sendenv",
        "setenv",
        "compression",
    }
)
MAX_INCLUDE_DEPTH = 16
MAX_LINES = 100_000


class SshConfigError(ValueError):
    """The config file cannot be read as an ssh client config (named with file and line)."""


@dataclass
class _Block:
    kind: str  # "host" | "match" | "all" (before any Host line)
    patterns: list[str] = field(default_factory=list)  # Host patterns, or Match criteria tokens
    options: list[tuple[str, str, str]] = field(default_factory=list)  # (keyword, value, "file:line")


def local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): fall back to the uid
        return str(os.getuid())


def _args(line: str, where: str) -> tuple[str, str]:
    line = line.strip()
    if "=" in line.split(None, 1)[0]:  # keyword=value
        key, _, value = line.partition("=")
    else:
        key, _, value = line.partition(" ")
        if not value and "\t" in key:
            key, _, value = key.partition("\t")
        value = value.strip()
        if value.startswith("="):
            value = value[1:]
    key, value = key.strip().lower(), value.strip()
    if not key:
        raise SshConfigError(f"{where}: missing keyword")
    return key, value


def _split(value: str, where: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise SshConfigError(f"{where}: {exc}") from None


class SshConfig:
    def __init__(self, blocks: list[_Block], unreadable: list[str]) -> None:
        self.blocks = blocks
        self.unreadable = unreadable  # Include patterns or files that could not be read

    @classmethod
    def load(cls, path: str | Path) -> SshConfig:
        blocks = [_Block("all")]
        unreadable: list[str] = []
        cls._read(Path(path).expanduser(), blocks, unreadable, 0, [0])
        return cls(blocks, unreadable)

    @classmethod
    def _read(cls, path: Path, blocks: list[_Block], unreadable: list[str], depth: int, count: list[int]) -> None:
        try:
            text = _read_config(path)
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            return
        for n, raw in enumerate(text.splitlines(), 1):
            count[0] += 1
            if count[0] > MAX_LINES:
                raise SshConfigError(f"{path}: more than {MAX_LINES} lines with its includes")
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{n}"
            key, value = _args(line, where)
            if key == "host":
                blocks.append(_Block("host", _split(value, where)))
            elif key == "match":
                blocks.append(_Block("match", _split(value, where)))
            elif key == "include":
                if depth >= MAX_INCLUDE_DEPTH:
                    raise SshConfigError(f"{where}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a loop?)")
                for pattern in _split(value, where):
                    full = os.path.expanduser(pattern)
                    if not os.path.isabs(full):
                        full = str(Path("~/.ssh").expanduser() / full)
                    matches = sorted(glob.glob(full))
                    for m in matches:
                        cls._read(Path(m), blocks, unreadable, depth + 1, count)
            else:
                blocks[-1].options.append((key, value, where))

    def lookup(self, host: str, user: str | None = None) -> dict[str, Any]:
        """Options for ``host`` (first value wins; IdentityFile accumulates), plus ``_ignored`` (options set
        for it that tfcluster does not honour) and ``_first_proxy`` (proxycommand or proxyjump, whichever
        came first: ssh lets the first one win)."""
        found: dict[str, Any] = {"identityfile": []}
        ignored: list[str] = []
        local = local_user()
        for block in self.blocks:
            if not self._matches(block, host, user or found.get("user") or local, local, ignored):
                continue
            for key, value, _ in block.options:
                if key == "identityfile":
                    found["identityfile"].append(value)
                elif key in HONOURED:
                    if key in ("proxycommand", "proxyjump") and "_first_proxy" not in found:
                        found["_first_proxy"] = key
                    found.setdefault(key, value)
                elif key not in HARMLESS and key not in ignored:
                    ignored.append(key)
        found["_ignored"] = ignored
        return found

    @staticmethod
    def _matches(block: _Block, host: str, user: str, local: str, ignored: list[str]) -> bool:
        if block.kind == "all":
            return True
        if block.kind == "host":
            return _host_matches(host, block.patterns)
        words = [w.lower() if i % 2 == 0 else w for i, w in enumerate(block.patterns)]
        i = 0
        while i < len(words):
            crit = words[i].lstrip("!")
            negate = words[i].startswith("!")
            if crit in ("all", "canonical", "final"):
                ok, i = True, i + 1
            elif crit in ("host", "originalhost", "user", "localuser") and i + 1 < len(words):
                subject = {"host": host, "originalhost": host, "user": user, "localuser": local}[crit]
                ok, i = _host_matches(subject, words[i + 1].split(",")), i + 2
            else:  # exec, localnetwork, tagged, ...: we cannot evaluate it; say so, and do not apply the block
                if f"match {crit}" not in ignored:
                    ignored.append(f"match {crit}")
                return False
            if ok == negate:
                return False
        return True


def _host_matches(name: str, patterns: list[str]) -> bool:
    """ssh's Host rule: a match of any positive pattern, and of no negated one."""
    matched = False
    for pattern in patterns:
        for part in pattern.split(","):
            neg = part.startswith("!")
            if fnmatch.fnmatchcase(name.lower(), part.lstrip("!").lower()):
                if neg:
                    return False
                matched = True
    return matched


def ssh_config_lookup(config_file: str | None) -> Any:
    """A lookup function over an OpenSSH client config, or None when there is none to honour."""
    if not config_file:
        return None
    path = Path(config_file).expanduser()
    if not path.is_file():
        return None
    config = SshConfig.load(path)

    def lookup(host: str) -> Mapping[str, Any]:
        return config.lookup(host)

    return lookup


#: An ssh config (with its Includes) larger than this is not one: read no further (a 3 GB file took 9 GB)
MAX_CONFIG_BYTES = 1 << 20


def _read_config(path: Path) -> str:
    """The text of one config file: a regular file (links followed, as ssh does: dotfiles often are
    links), never a FIFO waited on, at most ``MAX_CONFIG_BYTES``; an OSError saying why otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_CONFIG_BYTES >> 20} MiB")
    return data.decode("utf-8", "replace")
