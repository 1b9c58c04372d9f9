"""A spec host → how to reach it over SSH: ~/.ssh/config under the spec's overrides, jumps, tokens.

Precedence: a value in the spec (host, then ssh:) wins over ~/.ssh/config, which wins over the
defaults. Tokens in ProxyCommand (%h %p %r %n %u %d %l %L %%) are expanded after that, so they see
the port and user that will really be used; substituted values are shell-quoted when they need it.
ProxyJump (``[user@]host[:port]``, comma-separated, or ``ssh://`` URIs) becomes a chain of jump
targets, each resolved through the same config; every hop's host key is verified.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ...core.errors import UsageError
from ...core.terminal import safe_text
from ...plan import SshTarget
from ...spec import ClusterSpec

SshLookup = Callable[[str], Mapping[str, Any]]
_TOKEN = re.compile(r"%(.)")
_JUMP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@\s/]+)@)?(?P<host>\[[^\]]+\]|[^:\s/]+)(?::(?P<port>\d+))?/?$")
MAX_JUMPS = 8


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def expand_tokens(template: str, *, hostname: str, port: int, user: str, original: str, local_user: str) -> str:
    """ssh_config(5) TOKENS for ProxyCommand; an unknown token is an error, as in ssh."""
    values = {
        "h": hostname,
        "p": str(port),
        "r": user,
        "n": original,
        "u": local_user,
        "d": os.path.expanduser("~"),
        "l": socket.gethostname(),
        "L": socket.gethostname().split(".")[0],
    }

    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key == "%":
            return "%"
        if key not in values:
            raise UsageError(f"~/.ssh/config: ProxyCommand {template!r}: token %{key} is not supported by tfcluster")
        value = values[key]
        if value.startswith("-"):  # quoting does not stop an option: ssh reads '-oProxyCommand=...' as one
            raise UsageError(f"ProxyCommand {template!r}: %{key} would be {value[:60]!r}, which starts with '-'")
        return value if re.fullmatch(r"[\w.:@\[\]/+-]*", value) else shlex.quote(value)

    return _TOKEN.sub(sub, template)


def ssh_target(
    spec: ClusterSpec, host: Any, local_user: str, lookup: SshLookup | None, warnings: list[str]
) -> SshTarget:
    """The target of one spec host (``host``: a HostSpec), warnings appended for what is ignored."""
    cfg: Mapping[str, Any] = lookup(host.address) if lookup else {}
    identity = host.identity_file or spec.ssh.identity_file
    identities: tuple[str, ...] = (identity,) if identity else tuple(cfg.get("identityfile", ()) or ())
    port = host.port or spec.ssh.port or _int(cfg.get("port")) or 22
    user = host.user or spec.ssh.user or str(cfg.get("user") or local_user)
    hostname = str(cfg.get("hostname") or host.address).replace("%h", host.address)
    _report(cfg, host.address, warnings)
    proxy, jumps = None, ()
    first = cfg.get("_first_proxy")
    if first == "proxycommand" and cfg.get("proxycommand", "").lower() != "none":
        proxy = expand_tokens(
            cfg["proxycommand"], hostname=hostname, port=port, user=user, original=host.address, local_user=local_user
        )
    elif first == "proxyjump" and cfg.get("proxyjump", "").lower() != "none":
        jumps = _jumps(cfg["proxyjump"], spec, lookup, local_user, warnings, [host.address])
    known = spec.ssh.known_hosts
    if "known_hosts" not in spec.ssh.model_fields_set and cfg.get("userknownhostsfile"):
        known = str(cfg["userknownhostsfile"]).split()[0]
    timeout = spec.ssh.connect_timeout_s
    if "connect_timeout_s" not in spec.ssh.model_fields_set and _int(cfg.get("connecttimeout")):
        timeout = float(_int(cfg.get("connecttimeout")) or timeout)
    keepalive = spec.ssh.keepalive_s
    if "keepalive_s" not in spec.ssh.model_fields_set and _int(cfg.get("serveraliveinterval")) is not None:
        keepalive = float(_int(cfg.get("serveraliveinterval")) or 0)
    return SshTarget(
        address=host.address,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identities,
        proxy_command=proxy,
        known_hosts=known,
        connect_timeout_s=timeout,
        keepalive_s=keepalive,
        jumps=jumps,
    )


def _jumps(
    value: str, spec: ClusterSpec, lookup: SshLookup | None, local_user: str, warnings: list[str], seen: list[str]
) -> tuple[SshTarget, ...]:
    """ProxyJump hosts in the order the connection goes through them (each resolved through the config,
    its own ProxyJump first); a loop or more than MAX_JUMPS hops is an error."""
    out: list[SshTarget] = []
    for part in (p.strip() for p in value.split(",")):
        m = _JUMP.fullmatch(part)
        if m is None:
            raise UsageError(f"~/.ssh/config: ProxyJump {value!r}: {part!r} is not [user@]host[:port]")
        name = m.group("host").strip("[]")
        if name in seen or len(seen) > MAX_JUMPS:
            raise UsageError(
                f"~/.ssh/config: ProxyJump loops or chains more than {MAX_JUMPS} hosts: {' -> '.join(seen)}"
            )
        cfg: Mapping[str, Any] = lookup(name) if lookup else {}
        _report(cfg, name, warnings)
        if cfg.get("_first_proxy") == "proxyjump" and cfg.get("proxyjump", "").lower() != "none":
            out.extend(_jumps(cfg["proxyjump"], spec, lookup, local_user, warnings, [*seen, name]))
        elif cfg.get("_first_proxy") == "proxycommand":
            warnings.append(f"~/.ssh/config: the ProxyCommand of jump host {name} is ignored (only ProxyJump chains)")
        identities = tuple(cfg.get("identityfile", ()) or ())
        if not identities and spec.ssh.identity_file:
            identities = (spec.ssh.identity_file,)
        out.append(
            SshTarget(
                address=name,
                hostname=str(cfg.get("hostname") or name).replace("%h", name),
                port=int(m.group("port") or _int(cfg.get("port")) or 22),
                user=m.group("user") or str(cfg.get("user") or local_user),
                identity_files=identities,
                known_hosts=spec.ssh.known_hosts,
                connect_timeout_s=spec.ssh.connect_timeout_s,
                keepalive_s=spec.ssh.keepalive_s,
            )
        )
    return tuple(out)


def _report(cfg: Mapping[str, Any], host: str, warnings: list[str]) -> None:
    ignored = cfg.get("_ignored") or []
    if ignored:
        # (the keywords are the config file's own text: nothing in them drives the terminal)
        line = safe_text(f"ssh config: for {host}, tfcluster ignores: {', '.join(map(str, ignored))}")
        if line not in warnings:
            warnings.append(line)
