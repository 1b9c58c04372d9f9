"""The node's end of a connect-back channel: worker_entry dials the supervisor (schedulers start it).

Under a scheduler (Slurm, Kubernetes) nobody SSHes into the node: the scheduler starts
``python -m worker_entry connect`` (or a scheduler mode built on it), which connects to the supervisor
at ``TFCLUSTER_CONNECT`` (host:port), proves it holds the per-run secret and checks that the
supervisor holds it too (HMAC-SHA256 over both sides' nonces and the rank: the secret never crosses
the network), receives its ``NodeConfig``, and from then speaks exactly the protocol it speaks over
an SSH channel. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from typing import Any

from .protocol.env import Env

HANDSHAKE_VERSION = 1
MAX_LINE = 64 << 10
CONNECT_TIMEOUT_S = 30.0


class HandshakeError(OSError):
    """The other side is not our supervisor / node, or broke the handshake."""


def mac(secret: bytes, role: bytes, first: str, second: str, rank: int) -> str:
    """HMAC-SHA256 of (role, both nonces in order, the rank): each side signs for its own role."""
    return hmac.new(secret, b"|".join([role, first.encode(), second.encode(), str(rank).encode()]), hashlib.sha256).hexdigest()


def read_line(sock: socket.socket, limit: int = MAX_LINE) -> bytes:
    """One newline-terminated line, read byte-wise (so nothing after it is consumed), bounded."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise HandshakeError("connection closed during the handshake")
        buf += chunk
        if len(buf) > limit:
            raise HandshakeError("handshake line too long")
    return bytes(buf[:-1])


def _json_line(sock: socket.socket) -> dict[str, Any]:
    try:
        obj = json.loads(read_line(sock))
    except (ValueError, RecursionError) as exc:
        raise HandshakeError(f"bad handshake message: {exc}") from None
    if not isinstance(obj, dict):
        raise HandshakeError("bad handshake message: not an object")
    return obj


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{Env.CONNECT}={text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def connect_back(address: tuple[str, int], secret: bytes, rank: int, timeout: float = CONNECT_TIMEOUT_S) -> tuple[socket.socket, bytes]:
    """Dial the supervisor and authenticate both ways; returns the socket and the config line."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = _json_line(sock)
        server_nonce = hello.get("nonce")
        if hello.get("tfcluster") != "connect" or not isinstance(server_nonce, str) or len(server_nonce) != 64:
            raise HandshakeError("the peer is not a tfcluster supervisor")
        nonce = secrets.token_hex(32)
        answer = {"rank": rank, "nonce": nonce, "mac": mac(secret, b"node", server_nonce, nonce, rank)}
        sock.sendall(json.dumps(answer).encode() + b"\n")
        reply = _json_line(sock)
        expected = mac(secret, b"supervisor", nonce, server_nonce, rank)
        if not isinstance(reply.get("mac"), str) or not hmac.compare_digest(reply["mac"], expected):
            raise HandshakeError(f"the supervisor refused rank {rank} or does not hold this run's secret")
        config = read_line(sock, 16 << 20)
        sock.settimeout(None)
        return sock, config
    except BaseException:
        sock.close()
        raise


def secret_from_env(env: Mapping[str, str] = os.environ) -> bytes:
    raw = env.get(Env.SECRET, "")
    try:
        secret = bytes.fromhex(raw)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise ValueError(f"{Env.SECRET} must hold the run's secret (hex, at least 16 bytes)")
    return secret


def main(rank: int | None = None, env: Mapping[str, str] = os.environ) -> int:
    """``python -m worker_entry connect``: rank from ``TFCLUSTER_RANK`` unless given."""
    from .protocol import NodeConfig, ProtocolError
    from .runner import serve

    try:
        address = parse_address(env.get(Env.CONNECT, ""))
        secret = secret_from_env(env)
        rank = int(env.get(Env.RANK, "")) if rank is None else rank
    except ValueError as exc:
        print(f"worker_entry connect: {exc}", file=sys.stderr)
        return 2
    os.environ.pop(Env.SECRET, None)  # the training command never sees it
    try:
        sock, line = connect_back(address, secret, rank)
    except OSError as exc:
        print(f"worker_entry connect: cannot reach the supervisor at {address[0]}:{address[1]}: {exc}", file=sys.stderr)
        return 3
    try:
        config = NodeConfig.parse_line(line)
    except ProtocolError as exc:
        print(f"worker_entry connect: bad configuration from the supervisor: {exc}", file=sys.stderr)
        sock.close()
        return 2
    return serve(config, sock)
