"""Sealed records: every byte of a connect-back channel after the handshake, authenticated and encrypted.

After the handshake both sides derive two keys (HKDF-SHA256 of the run's secret, salted with both
nonces, one per direction) and from then on write only records: a 4-byte length, then the AES-256-GCM
ciphertext of at most ``RECORD_MAX`` bytes with its 16-byte tag. The nonce is a per-direction counter
(never sent): a record replayed, reordered, dropped, forged or taken from another connection fails to
open, and so does everything after it. The length is authenticated too (it is the associated data).

The key schedule and the record format are stdlib code; the cipher comes from ``cryptography`` (a
paramiko dependency, on every tfcluster node), imported only when a channel is opened, with a clear
error where it is missing.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

from .frames import ProtocolError

RECORD_MAX = 256 << 10  # plaintext per record: bounds what a receiver buffers before it can check it
TAG = 16
HEADER = struct.Struct("!I")
_NONCE = struct.Struct("!IQ")  # 4 zero bytes, then the record counter: 12 bytes
LABEL = b"tfcluster connect-back v2"
_COUNTER_MAX = (1 << 64) - 1


class SealError(ProtocolError):
    """A record failed authentication (forged, replayed, reordered, corrupted) or is malformed."""


class CryptoUnavailable(RuntimeError):
    """The ``cryptography`` package is missing: connect-back channels cannot be sealed."""


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 HKDF with SHA-256."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def channel_keys(secret: bytes, server_nonce: str, node_nonce: str, rank: int) -> tuple[bytes, bytes]:
    """(supervisor → node key, node → supervisor key) of one connection."""
    salt = bytes.fromhex(server_nonce) + bytes.fromhex(node_nonce)
    info = LABEL + b"|" + str(rank).encode() + b"|"
    return hkdf_sha256(secret, salt, info + b"to-node"), hkdf_sha256(secret, salt, info + b"to-supervisor")


def _cipher(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise CryptoUnavailable(
            "connect-back channels are encrypted with the 'cryptography' package, which is missing here: "
            "pip install cryptography (it comes with tfcluster's paramiko dependency)"
        ) from None
    return AESGCM(key)


def check_available() -> None:
    """Raise ``CryptoUnavailable`` now rather than after the handshake."""
    _cipher(bytes(32))


class Sealer:
    """One direction's writer: plaintext in, records out (in order; one ``Sealer`` per direction)."""

    def __init__(self, key: bytes) -> None:
        self._aead = _cipher(key)
        self._counter = 0

    def seal(self, data: bytes | bytearray | memoryview) -> bytes:
        view = memoryview(data)
        out = []
        for at in range(0, len(view), RECORD_MAX):
            chunk = view[at : at + RECORD_MAX]
            header = HEADER.pack(len(chunk) + TAG)
            out.append(header)
            out.append(self._aead.encrypt(self._nonce(), bytes(chunk), header))
        return b"".join(out)

    def _nonce(self) -> bytes:
        if self._counter >= _COUNTER_MAX:
            raise SealError("record counter exhausted")
        nonce = bytes(4) + self._counter.to_bytes(8, "big")
        self._counter += 1
        return nonce


class Opener:
    """One direction's reader: bytes in as they arrive, plaintext out once each record is checked.
    Holds at most one incomplete record; after a failure every later byte is refused."""

    def __init__(self, key: bytes) -> None:
        self._aead = _cipher(key)
        self._counter = 0
        self._buf = bytearray()
        self.failed: SealError | None = None

    @property
    def pending(self) -> int:
        """Bytes of a record not complete yet (a connection that ends here was cut mid-record)."""
        return len(self._buf)

    def feed(self, data: bytes) -> bytes:
        """The plaintext of every record ``data`` completes. The records are cut from one ``bytes``
        (what came, or the incomplete record held since, plus it): one copy of each ciphertext, the
        nonce packed in one call; only an incomplete record's bytes are held for the next feed."""
        if self.failed is not None:
            raise self.failed
        if self._buf:  # the rest of a record: copied out only once it is complete (a peer that sends a
            self._buf += data  # byte at a time costs a buffer append each, not a copy of the buffer)
            if len(self._buf) < HEADER.size:
                return b""
            (size,) = HEADER.unpack_from(self._buf)
            if TAG <= size <= RECORD_MAX + TAG and len(self._buf) < HEADER.size + size:
                return b""
            buf = bytes(self._buf)
        else:
            buf = bytes(data)
        pos, n, out = 0, len(buf), []
        while n - pos >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, pos)
            if not TAG <= size <= RECORD_MAX + TAG:
                self._fail(f"malformed record: {size} bytes (at most {RECORD_MAX + TAG})")
            end = pos + HEADER.size + size
            if end > n:
                break
            try:
                out.append(
                    self._aead.decrypt(
                        _NONCE.pack(0, self._counter), buf[pos + HEADER.size : end], buf[pos : pos + HEADER.size]
                    )
                )
            except Exception:  # cryptography's InvalidTag: forged, replayed, reordered or corrupted
                self._fail("a record failed authentication (forged, replayed or corrupted data)")
            self._counter += 1
            pos = end
        if pos < n:
            self._buf = bytearray(buf[pos:])
        elif self._buf:
            self._buf = bytearray()
        return out[0] if len(out) == 1 else b"".join(out)

    def _fail(self, why: str) -> None:
        self.failed = SealError(why)
        self._buf = bytearray()
        raise self.failed
