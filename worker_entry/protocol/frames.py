"""Frames on a node's byte stream: a sync marker, then ``!BBI`` (type, stream, length) + payload.

Node → launcher (worker_entry's stdout, or a connect-back socket): a sync ``MARKER`` (anything before
it is a chatty login shell), then ``LOG`` frames (complete lines of the user's stdout/stderr; one whose payload ends in
``\\r`` instead is a progress frame: the current text of an unfinished line being redrawn),
``MSG`` frames (one JSON message each) and ``DATA`` frames (file contents). Launcher → node:
newline-delimited JSON (the node config, then commands). Every size is bounded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from .cluster import MAX_TASKS

MARKER = b"\n\x00TFCLUSTER-WIRE-1\x00\n"
HEADER = struct.Struct("!BBI")
T_LOG, T_MSG, T_DATA = 1, 2, 3
STDOUT, STDERR = 1, 2
#: Largest payload per frame type: a LOG frame holds at most a cut 1 MiB line plus one read chunk.
MAX_PAYLOAD = {T_LOG: 4 << 20, T_MSG: 1 << 20, T_DATA: 4 << 20}
MAX_PREAMBLE = 64 << 10  # shell noise kept before the marker (the newest bytes)
MAX_COMMAND_LINE = 1 << 20  # launcher → node: one JSON line
#: The first launcher → node line, the ``NodeConfig``, carries the cluster (every task's endpoint): 1 MiB
#: plus 128 bytes per task of the largest cluster, 9 MiB. A 16,384-task cluster of 253-character DNS names
#: (4.3 MB) fits, and 65,536 endpoints of the usual length (``10.1.2.3:12345``, ``node00017.cluster:2222``).
#: Only a node reads it, from its authenticated launcher; every node → launcher limit stays as it is.
MAX_CONFIG_LINE = MAX_COMMAND_LINE + MAX_TASKS * 128


class ProtocolError(ValueError):
    """A peer sent something this protocol does not allow; ``field`` names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def log_frame(stream: int, data: bytes) -> bytes:
    return HEADER.pack(T_LOG, stream, len(data)) + data


def data_frame(data: bytes) -> bytes:
    return HEADER.pack(T_DATA, 0, len(data)) + data


def msg_frame(msg: Any) -> bytes:
    """One MSG frame from a message (anything with ``to_dict``) or a plain dict."""
    obj = msg.to_dict() if hasattr(msg, "to_dict") else msg
    payload = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()
    return HEADER.pack(T_MSG, 0, len(payload)) + payload


#: A launcher → node line's JSON text: compact, no NaN; one encoder for every line, not one per call.
compact_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def command_line(obj: Any) -> bytes:
    """One launcher → node line from a command, a config (anything with ``to_dict``) or a dict."""
    if hasattr(obj, "to_line"):  # the NodeConfig: its cluster encoded once for every task
        return obj.to_line()
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return compact_json(data).encode() + b"\n"


@dataclass
class Frame:
    type: int
    stream: int
    payload: bytes


class FrameDecoder:
    """Incremental, bounded decoder. ``preamble`` holds what came before the marker (at most
    ``MAX_PREAMBLE`` bytes, the newest); after a ``ProtocolError`` every later byte is dropped."""

    def __init__(self, synced: bool = False) -> None:
        self._buf = bytearray()
        self.synced = synced
        self.preamble = bytearray()
        self.failed: ProtocolError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes. They are cut from one ``bytes`` (what came, or the incomplete
        frame held since plus it): one copy of each payload; an incomplete frame's bytes are only
        appended to until it is complete (a 4 MiB frame sent in pieces is not copied per piece)."""
        if self.failed is not None:
            return []
        if self._buf or not self.synced:
            self._buf += data
            if not self.synced and not self._sync():
                return []
            if len(self._buf) < HEADER.size:
                return []
            ftype, _, length = HEADER.unpack_from(self._buf)
            if length <= MAX_PAYLOAD.get(ftype, -1) and len(self._buf) < HEADER.size + length:
                return []  # a valid header whose frame is not complete yet
            buf = bytes(self._buf)
        else:
            buf = bytes(data)
        frames: list[Frame] = []
        pos, n = 0, len(buf)
        while n - pos >= HEADER.size:
            ftype, stream, length = HEADER.unpack_from(buf, pos)
            limit = MAX_PAYLOAD.get(ftype)
            if limit is None or length > limit:
                self.failed = ProtocolError(
                    f"bad frame header (type {ftype}, length {length})"
                    if limit is None
                    else f"oversized frame: {length} bytes (at most {limit} for type {ftype})"
                )
                self._buf = bytearray()
                if frames:
                    return frames  # what was valid before the bad header; the error comes next time
                raise self.failed
            end = pos + HEADER.size + length
            if end > n:
                break
            frames.append(Frame(ftype, stream, buf[pos + HEADER.size : end]))
            pos = end
        if pos < n:
            self._buf = bytearray(buf[pos:])
        elif self._buf:
            self._buf = bytearray()
        return frames

    def _sync(self) -> bool:
        at = self._buf.find(MARKER)
        if at < 0:
            keep = len(MARKER) - 1  # a tail that may be the marker's beginning
            if len(self._buf) > keep:
                self.preamble += self._buf[:-keep]
                del self._buf[:-keep]
                if len(self.preamble) > MAX_PREAMBLE:
                    del self.preamble[: len(self.preamble) - MAX_PREAMBLE]
            return False
        self.preamble += self._buf[:at]
        del self.preamble[: max(0, len(self.preamble) - MAX_PREAMBLE)]
        del self._buf[: at + len(MARKER)]
        self.synced = True
        return True

    def raise_pending(self) -> None:
        if self.failed is not None:
            raise self.failed

    @property
    def pending(self) -> int:
        return len(self._buf)
