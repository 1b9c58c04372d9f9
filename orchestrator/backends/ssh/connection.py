"""SSH transport on paramiko: verified host keys, agent + key files, ~/.ssh/config already resolved.

One connection per host; every remote process is one exec channel on it. The remote command line
holds nothing but the quoted interpreter (see shellquote); data goes over stdin.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# paramiko imports `invoke` (~50 ms) only for its own ssh_config parser's `Match exec`; tfcluster reads
# ~/.ssh/config itself (plan/sshconfig.py), so the launcher does not pay for it.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]

import paramiko  # noqa: E402

from ...plan.quoting import exec_line  # noqa: E402
from ..base import Channel, ConnectFailure, Connection  # noqa: E402

#: paramiko's default. A 16 MiB window measured 40% slower gathers and 3x the sshd CPU here
#: (docs/benchmarks.md); 2 MiB still fills a 1 GB/s link at 2 ms RTT.
WINDOW_SIZE = 2 * 1024 * 1024
MAX_PACKET = 32 * 1024


#: AES-GCM first: one authenticated-encryption call per packet instead of a cipher plus an HMAC,
#: half the launcher CPU per byte (measured: 0.53 vs 0.8-1.05 s per 256 MiB). Others remain as fallbacks.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")


def _transport_factory(sock, **kwargs) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **kwargs)
    opts = transport.get_security_options()
    supported = set(opts.ciphers)
    preferred = [c for c in PREFERRED_CIPHERS if c in supported]
    opts.ciphers = tuple(preferred + [c for c in opts.ciphers if c not in preferred])
    return transport


class SshChannel(Channel):
    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan
        self._lock = threading.Lock()

    def filenos(self) -> list[int]:
        return [self.chan.fileno()]

    def read(self) -> tuple[bytes, bytes, bool]:
        chan = self.chan
        out = bytearray()
        err = bytearray()
        while chan.recv_ready():
            data = chan.recv(1 << 20)
            if not data:
                break
            out += data
        while chan.recv_stderr_ready():
            data = chan.recv_stderr(1 << 20)
            if not data:
                break
            err += data
        eof = (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready()
        if eof:
            # Clear the poll pipe's level so a select loop does not spin on a finished channel.
            try:
                chan.recv(1 << 16)
            except Exception:
                pass
        return bytes(out), bytes(err), eof

    def send(self, data: bytes) -> None:
        with self._lock:
            try:
                self.chan.sendall(data)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise OSError(errno.EPIPE, f"channel closed: {exc}") from None

    def exit_status(self) -> int | None:
        if self.chan.exit_status_ready():
            return self.chan.recv_exit_status()
        transport = self.chan.get_transport()
        if self.chan.closed or transport is None or not transport.is_active():
            return -1
        return None

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:
            pass
        try:
            self.chan.close()
        except Exception:
            pass

    def close_confirmed(self, timeout_s: float) -> bool:
        """EOF to worker_entry (it exits once its task's process tree is gone), then its exit status:
        sshd sends it only after it reaped the process, so it is the node's confirmation."""
        chan = self.chan
        try:
            chan.shutdown_write()
        except Exception:
            pass
        deadline = time.monotonic() + timeout_s
        while not chan.exit_status_ready():
            left = deadline - time.monotonic()
            transport = chan.get_transport()
            if left <= 0 or chan.closed or transport is None or not transport.is_active():
                break
            chan.status_event.wait(min(left, 0.1))
        confirmed = chan.exit_status_ready()
        self.close()
        return confirmed


class KeyCache:
    """Private keys loaded once per launcher, not once per host (parsing costs CPU per host)."""

    def __init__(self) -> None:
        self._keys: dict[str, paramiko.PKey] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> paramiko.PKey:
        full = str(Path(path).expanduser())
        with self._lock:
            if full not in self._keys:
                _check_key_file(full, path)  # a FIFO hung every connection (this lock), /dev/zero ate memory
                try:
                    self._keys[full] = paramiko.PKey.from_path(full)
                except FileNotFoundError:
                    raise ConnectFailure(
                        "key", f"identity file {path} does not exist", "fix ssh.identity_file"
                    ) from None
                except paramiko.PasswordRequiredException:
                    raise ConnectFailure(
                        "key",
                        f"identity file {path} is passphrase-protected",
                        f"load it into the agent (ssh-add {path}) and leave identity_file unset, or use a key "
                        "without passphrase",
                    ) from None
                except (paramiko.SSHException, ValueError, OSError) as exc:
                    raise ConnectFailure("key", f"cannot read identity file {path}: {exc}", "") from None
            return self._keys[full]


class SshConnection(Connection):
    def __init__(
        self,
        *,
        hostname: str,
        port: int,
        user: str,
        identity_files: Sequence[str] = (),
        known_hosts: str = "~/.ssh/known_hosts",
        connect_timeout_s: float = 10.0,
        keepalive_s: float = 5.0,
        proxy_command: str | None = None,
        label: str | None = None,
        keys: KeyCache | None = None,
        jumps: Sequence[Any] = (),
    ) -> None:
        self.hostname = hostname
        self.port = port
        self.user = user
        self.identity_files = tuple(identity_files)
        self.known_hosts = known_hosts
        self.timeout = connect_timeout_s
        self.keepalive = keepalive_s
        self.proxy_command = proxy_command
        self.label = label or (hostname if port == 22 else f"{hostname}:{port}")
        self.keys = keys or KeyCache()
        self.client: paramiko.SSHClient | None = None
        self.jumps = tuple(jumps)  # plan SshTargets, in the order the connection goes through them
        self.jump_clients: list[paramiko.SSHClient] = []

    def connect(self) -> SshConnection:
        """Connect and authenticate (through every jump host, each one's host key verified), or raise
        ConnectFailure saying what failed and what to try."""
        known = Path(self.known_hosts).expanduser()
        if not known.is_file():
            raise ConnectFailure(
                "host_key_unknown",
                f"known_hosts file {self.known_hosts} does not exist, so no host key can be verified",
                f"verify the host's key fingerprint, then: ssh-keyscan -p {self.port} {self.hostname} >> {self.known_hosts}",
            )
        sock: Any = None
        if self.proxy_command and not self.jumps:
            sock = paramiko.ProxyCommand(self.proxy_command)  # tokens were expanded in the plan
        hops = [*self.jumps, None]
        try:
            for n, hop in enumerate(hops):
                last = hop is None
                host, port, user = (self.hostname, self.port, self.user) if last else (hop.hostname, hop.port, hop.user)
                files = self.identity_files if last else hop.identity_files
                prefix = "" if last else f"jump host {user}@{host}:{port}: "
                try:
                    client = self._open(host, port, user, files, known, sock)
                except ConnectFailure as exc:
                    raise ConnectFailure(exc.kind, prefix + exc.message, exc.hint) from None
                if last:
                    self.client = client
                    break
                self.jump_clients.append(client)
                nxt = hops[n + 1]
                dest = (self.hostname, self.port) if nxt is None else (nxt.hostname, nxt.port)
                try:
                    transport = client.get_transport()
                    assert transport is not None
                    sock = transport.open_channel("direct-tcpip", dest, ("127.0.0.1", 0), timeout=self.timeout)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise ConnectFailure(
                        "unreachable",
                        f"{prefix}cannot open a channel to {dest[0]}:{dest[1]}: {exc}",
                        "check that the jump host can reach it (AllowTcpForwarding on the jump host's sshd)",
                    ) from None
        except BaseException:
            self.close()
            raise
        transport = self.client.get_transport() if self.client else None
        if transport is not None and self.keepalive > 0:
            transport.set_keepalive(int(max(1, self.keepalive)))
        return self

    def _open(
        self, hostname: str, port: int, user: str, identity_files: Sequence[str], known: Path, sock: Any
    ) -> paramiko.SSHClient:
        """One verified, authenticated SSH hop (over ``sock`` when it is behind a jump or a ProxyCommand)."""
        keyname = hostname if port == 22 else f"[{hostname}]:{port}"
        client = paramiko.SSHClient()
        client.load_system_host_keys(str(known))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        # An identity file named in the spec must exist; those from ~/.ssh/config are skipped if absent.
        files = [p for p in identity_files if len(identity_files) == 1 or Path(p).expanduser().exists()]
        pkeys = [self.keys.get(p) for p in files]
        try:
            client.connect(
                hostname,
                port=port,
                username=user,
                pkey=pkeys[0] if pkeys else None,
                key_filename=[str(Path(p).expanduser()) for p in files[1:]] or None,
                timeout=self.timeout,
                banner_timeout=self.timeout,
                auth_timeout=self.timeout,
                channel_timeout=self.timeout,
                allow_agent=True,
                look_for_keys=not pkeys,
                sock=sock,
                transport_factory=_transport_factory,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise ConnectFailure(
                "host_key_changed",
                f"host key CHANGED: {keyname} presented a {exc.key.get_name()} key that does not match "
                f"{self.known_hosts} (host reinstalled, or someone is intercepting the connection)",
                f"verify the new fingerprint out of band, then: ssh-keygen -R '{keyname}' -f {self.known_hosts} "
                f"and add the new key",
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            tried = ", ".join(identity_files) or "the SSH agent and ~/.ssh/id_* keys"
            raise ConnectFailure(
                "auth",
                f"authentication as {user} failed ({exc}); tried {tried}",
                f"check that the public key is in ~{user}/.ssh/authorized_keys on {hostname}, "
                "and ssh.user / identity_file in the spec",
            ) from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            reasons = {e.errno for e in exc.errors.values() if isinstance(e, OSError)}
            if reasons <= {errno.ECONNREFUSED}:
                raise ConnectFailure(
                    "refused",
                    f"connection refused on {hostname} port {port}",
                    "is sshd running and listening on that port? check ssh.port / hosts[].port",
                ) from None
            raise ConnectFailure("unreachable", f"cannot connect to {hostname}:{port}: {exc}", "") from None
        except TimeoutError:
            client.close()
            raise ConnectFailure(
                "timeout",
                f"no answer from {hostname}:{port} within {self.timeout:g}s",
                "host down, firewalled, or the wrong address; raise ssh.connect_timeout_s for slow links",
            ) from None
        except socket.gaierror as exc:
            client.close()
            raise ConnectFailure(
                "dns", f"cannot resolve {hostname}: {exc.strerror}", "check hosts[].address and DNS"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            if "not found in known_hosts" in text:
                raise ConnectFailure(
                    "host_key_unknown",
                    f"host key of {keyname} is not in {self.known_hosts}; unknown keys are refused",
                    f"verify its fingerprint, then: ssh-keyscan -p {port} {hostname} >> {self.known_hosts}",
                ) from None
            raise ConnectFailure(
                "ssh", f"SSH handshake with {hostname if port == 22 else f'{hostname}:{port}'} failed: {text}", ""
            ) from None
        except OSError as exc:
            client.close()
            kind = "unreachable" if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) else "ssh"
            raise ConnectFailure(
                kind, f"cannot connect to {hostname if port == 22 else f'{hostname}:{port}'}: {exc.strerror or exc}", ""
            ) from None
        return client

    def exec(self, argv: Sequence[str]) -> SshChannel:
        if self.client is None:
            raise OSError(errno.ENOTCONN, f"not connected to {self.label}")
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise OSError(errno.ENOTCONN, f"connection to {self.label} is closed")
        try:
            chan = transport.open_session(window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET, timeout=self.timeout)
            chan.exec_command(exec_line(argv))
        except (paramiko.SSHException, EOFError) as exc:
            raise OSError(errno.EIO, f"cannot start a process on {self.label}: {exc}") from None
        return SshChannel(chan)

    def sftp(self) -> paramiko.SFTPClient:
        assert self.client is not None
        return self.client.open_sftp()

    def is_alive(self) -> bool:
        t = self.client.get_transport() if self.client else None
        return bool(t and t.is_active())

    def close(self) -> None:
        for client in [self.client, *reversed(self.jump_clients)]:
            if client is not None:
                try:
                    client.close()
                except Exception:
                    pass
        self.jump_clients = []


def _check_key_file(full: str, path: str) -> None:
    """A private key is a regular file of a few KB: anything else is named before paramiko reads it."""
    try:
        st = os.stat(full)
    except FileNotFoundError:
        return  # said by the caller, as before
    except OSError as exc:
        raise ConnectFailure("key", f"identity file {path}: {exc.strerror or exc}", "fix ssh.identity_file") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "larger than 1 MiB"
        raise ConnectFailure("key", f"identity file {path}: {what}, not a private key", "fix ssh.identity_file")
