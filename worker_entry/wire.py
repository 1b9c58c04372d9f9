"""Wire protocol between the launcher and worker_entry over one SSH exec channel.

node → launcher (worker_entry's stdout): a sync marker, then frames `!BBI` (type, stream, length) +
payload. LOG frames carry raw complete lines (no per-line encoding: 100k lines cost one memcpy),
MSG frames one JSON object. Anything before the marker (a chatty login shell) is not protocol.

launcher → node (worker_entry's stdin): newline-delimited JSON: the config first, then commands
(`go`, `ping`, `stop`). Stdlib only: this module runs on every node.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

MARKER = b"\n\x00TFCLUSTER-WIRE-1\x00\n"
HEADER = struct.Struct("!BBI")
T_LOG = 1
T_MSG = 2
T_DATA = 3  # file contents during a gather
STDOUT = 1
STDERR = 2
MAX_FRAME = 64 * 1024 * 1024


class ProtocolError(Exception):
    pass


def log_frame(stream: int, data: bytes) -> bytes:
    return HEADER.pack(T_LOG, stream, len(data)) + data


def data_frame(data: bytes) -> bytes:
    return HEADER.pack(T_DATA, 0, len(data)) + data


def msg_frame(obj: dict[str, Any]) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), default=str).encode()
    return HEADER.pack(T_MSG, 0, len(payload)) + payload


def command_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Frame:
    type: int
    stream: int
    payload: bytes

    def json(self) -> dict[str, Any]:
        return json.loads(self.payload)


class FrameDecoder:
    """Incremental decoder; `preamble` keeps whatever came before the sync marker."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.synced = False
        self.preamble = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        if not self.synced:
            at = self._buf.find(MARKER)
            if at < 0:
                # Keep a tail that could be the start of the marker; the rest is shell noise.
                keep = len(MARKER) - 1
                if len(self._buf) > keep:
                    self.preamble += self._buf[:-keep]
                    del self._buf[:-keep]
                return []
            self.preamble += self._buf[:at]
            del self._buf[: at + len(MARKER)]
            self.synced = True
        frames = []
        buf = self._buf
        pos = 0
        n = len(buf)
        while n - pos >= HEADER.size:
            ftype, stream, length = HEADER.unpack_from(buf, pos)
            if ftype not in (T_LOG, T_MSG, T_DATA) or length > MAX_FRAME:
                raise ProtocolError(f"bad frame header type={ftype} length={length}")
            end = pos + HEADER.size + length
            if end > n:
                break
            frames.append(Frame(ftype, stream, bytes(buf[pos + HEADER.size : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buf)
