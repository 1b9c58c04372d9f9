"""The connect-back handshake, both sides' lines (standard library only).

A node that dials the supervisor proves it holds the run's secret for one rank, and the supervisor
proves it back, without either sending the secret: HMAC-SHA256 over a role, both sides' fresh nonces,
the rank and the attempt the node dials for (a late dialer of an earlier attempt cannot take the
place of the rank in this one: its proof names its own attempt, and the supervisor refuses it, signed). Then both derive the channel's keys from the secret and the nonces (``seal``), and every
later byte is a sealed record. The lines are short JSON objects with a newline, checked strictly:
whatever the other side sends, the result is the parsed value or one ``HandshakeError``.

    supervisor → node   {"tfcluster": "connect", "v": 3, "nonce": HEX64}
    node → supervisor   {"rank": R, "attempt": A, "nonce": HEX64, "mac": HMAC("node", s_nonce, n_nonce, R, A)}
    supervisor → node   {"ok": true, "mac": HMAC("supervisor", n_nonce, s_nonce, R, A)}, then sealed records
                     or {"ok": false, "why": TEXT, "mac": HMAC("refused", ..., TEXT)}  (only to a proven node)

A hello of another version is not final for the node (anyone could send one before the supervisor
listens): it keeps dialing, and says so if that is still all it got at its deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

VERSION = 3
MAX_ATTEMPT = 1000  # NodeConfig.attempt's range
MAX_LINE = 512  # every handshake line is far shorter; a longer one is not a tfcluster peer
MAX_RANK = 1 << 20
_HEX = frozenset("0123456789abcdef")


class HandshakeError(OSError):
    """The other side is not our supervisor / node, or broke the handshake (worth another try)."""


class Refused(HandshakeError):
    """The supervisor, proven to hold the run's secret, refused this rank: trying again cannot help."""


def new_nonce() -> str:
    return secrets.token_hex(32)


def is_hex64(value: Any) -> bool:
    """A nonce or a MAC as sent: 64 lowercase hex digits (anything else is refused before comparing)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def mac(secret: bytes, role: bytes, first: str, second: str, rank: int, extra: str = "", attempt: int = 0) -> str:
    """HMAC-SHA256 of (role, both nonces in order, the rank, the attempt[, a refusal's text]): each side
    signs for its role."""
    parts = [role, first.encode(), second.encode(), str(rank).encode(), str(attempt).encode()]
    parts += [extra.encode()] if extra else []
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).hexdigest()


def same_mac(expected: str, got: Any) -> bool:
    """Constant-time comparison of a MAC the peer sent (only 64 hex digits can match: no TypeError
    for a non-ASCII string, no early exit on its length)."""
    return is_hex64(got) and hmac.compare_digest(expected.encode(), got.encode())


def json_line(line: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise HandshakeError("not a tfcluster handshake line") from None
    if not isinstance(obj, dict):
        raise HandshakeError("not a tfcluster handshake line")
    return obj


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


# --- supervisor → node ------------------------------------------------------------------------------


def hello(nonce: str) -> bytes:
    return _line({"tfcluster": "connect", "v": VERSION, "nonce": nonce})


def parse_hello(line: bytes) -> str:
    """The supervisor's nonce."""
    obj = json_line(line)
    if obj.get("tfcluster") != "connect" or not is_hex64(obj.get("nonce")):
        raise HandshakeError("the peer is not a tfcluster supervisor")
    if obj.get("v") != VERSION:  # unauthenticated: not final (HandshakeError: the node dials again)
        raise HandshakeError(
            f"the supervisor speaks connect-back version {str(obj.get('v'))[:20]!r}, this node {VERSION}: "
            "install the same tfcluster on the launcher and the nodes"
        )
    return obj["nonce"]


def accepted(secret: bytes, rank: int, server_nonce: str, node_nonce: str, attempt: int = 0) -> bytes:
    return _line({"ok": True, "mac": mac(secret, b"supervisor", node_nonce, server_nonce, rank, attempt=attempt)})


def refused(secret: bytes, rank: int, server_nonce: str, node_nonce: str, why: str, attempt: int = 0) -> bytes:
    """A refusal to a node that proved it holds the secret (a wrong rank or attempt): signed, so it is final."""
    sig = mac(secret, b"refused", node_nonce, server_nonce, rank, why, attempt)
    return _line({"ok": False, "why": why, "mac": sig})


def refused_unsigned(why: str) -> bytes:
    """A refusal to a node that did not prove the secret: it cannot trust it, but learns why."""
    return _line({"ok": False, "why": why})


def parse_reply(line: bytes, secret: bytes, rank: int, server_nonce: str, node_nonce: str, attempt: int = 0) -> None:
    """Returns when the supervisor accepted us and proved it holds the secret; raises otherwise."""
    obj = json_line(line)
    why = obj.get("why")
    if obj.get("ok") is False and isinstance(why, str) and len(why) <= 200:
        if same_mac(mac(secret, b"refused", node_nonce, server_nonce, rank, why, attempt), obj.get("mac")):
            raise Refused(f"the supervisor refused rank {rank}: {why}")
        raise HandshakeError(f"refused without proof of the run's secret: {why}")
    if obj.get("ok") is not True or not same_mac(
        mac(secret, b"supervisor", node_nonce, server_nonce, rank, attempt=attempt), obj.get("mac")
    ):
        raise HandshakeError(f"the supervisor refused rank {rank} or does not hold this run's secret")


# --- node → supervisor ------------------------------------------------------------------------------


def answer(secret: bytes, rank: int, server_nonce: str, node_nonce: str, attempt: int = 0) -> bytes:
    proof = mac(secret, b"node", server_nonce, node_nonce, rank, attempt=attempt)
    return _line({"rank": rank, "attempt": attempt, "nonce": node_nonce, "mac": proof})


def parse_answer(line: bytes) -> tuple[int, int, str, str]:
    """(rank, attempt, the node's nonce, its MAC), shape-checked; the MAC is the caller's to verify."""
    obj = json_line(line)
    rank, attempt, nonce, their_mac = obj.get("rank"), obj.get("attempt"), obj.get("nonce"), obj.get("mac")
    if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= MAX_RANK):
        raise HandshakeError("not a tfcluster node (no valid rank)")
    if not (isinstance(attempt, int) and not isinstance(attempt, bool) and 0 <= attempt <= MAX_ATTEMPT):
        raise HandshakeError(f"rank {rank}: not a tfcluster node (no valid attempt)")
    if not is_hex64(nonce) or not is_hex64(their_mac):
        raise HandshakeError(f"rank {rank}: not a tfcluster node (malformed nonce or MAC)")
    return rank, attempt, nonce, their_mac
