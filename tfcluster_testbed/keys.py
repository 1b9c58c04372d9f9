"""SSH key material of a test bed: the user key, host keys and known_hosts.

Fresh keys per test bed, and a known_hosts that lists exactly its hosts, so clients can (and
must) connect with strict host key checking, as the launcher does on a real cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from .base import TestbedError, TestHost


def _keygen(paths: Sequence[Path], comment: str) -> None:
    """ssh-keygen ed25519 keys (no passphrase), several at a time."""
    for i in range(0, len(paths), 16):
        procs = [
            (
                p,
                subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(p)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                ),
            )
            for p in paths[i : i + 16]
        ]
        for p, proc in procs:
            out = proc.communicate(timeout=30)[0]
            if proc.returncode != 0:
                raise TestbedError(f"ssh-keygen for {p} failed: {out.decode(errors='replace').strip()}")


def _pubkey(path: Path) -> str:
    """'TYPE BASE64' of an OpenSSH public key file (comment dropped)."""
    typ, b64 = path.read_text().split()[:2]
    return f"{typ} {b64}"


def _host_key(directory: Path, host: TestHost, single_sshd: bool) -> Path:
    """The host's private host key (one shared key with single_sshd: one sshd serves many hosts)."""
    return directory / ("host_ed25519" if single_sshd else f"{host.name}_ed25519")


def _generate_keys(
    directory: Path, hosts: Sequence[TestHost], single_sshd: bool, user_key: Path, authorized_keys: Path, comment: str
) -> None:
    """The user key, every host key, and an authorized_keys that accepts the user key only."""
    host_keys = [directory / "host_ed25519"] if single_sshd else [directory / f"{h.name}_ed25519" for h in hosts]
    _keygen([user_key, *host_keys], comment)
    authorized_keys.write_text(_pubkey(user_key.with_suffix(".pub")) + "\n")


def _write_known_hosts(path: Path, hosts: Sequence[TestHost], directory: Path, single_sshd: bool) -> None:
    """One line per host, at the address and port it really listens on (``[addr]:port`` unless 22)."""
    lines = []
    for h in hosts:
        where = h.address if h.ssh_port == 22 else f"[{h.address}]:{h.ssh_port}"
        lines.append(f"{where} {_pubkey(_host_key(directory, h, single_sshd).with_suffix('.pub'))}")
    path.write_text("\n".join(lines) + "\n")
