"""Sits between worker_entry and the launcher on one host (tests only): forwards the frame stream and,
right after the `spawned` message, injects a heartbeat whose `seq` is not a number — a broken node.
`--before-go` injects it right after `hello` instead."""

import json
import os
import struct
import sys

MARKER = b"\n\x00TFCLUSTER-WIRE-1\x00\n"
HEADER = struct.Struct("!BBI")
after = "hello" if "--before-go" in sys.argv else "spawned"
buf = b""
synced = False
injected = False
out = sys.stdout.buffer
while True:
    data = os.read(0, 65536)
    if not data:
        break
    if injected:
        out.write(data)
        out.flush()
        continue
    buf += data
    if not synced:
        at = buf.find(MARKER)
        if at < 0:
            continue
        out.write(buf[: at + len(MARKER)])
        buf = buf[at + len(MARKER) :]
        synced = True
    while len(buf) >= HEADER.size and not injected:
        kind, _, length = HEADER.unpack_from(buf)
        if len(buf) < HEADER.size + length:
            break
        frame, buf = buf[: HEADER.size + length], buf[HEADER.size + length :]
        out.write(frame)
        if kind == 2 and json.loads(frame[HEADER.size :]).get("type") == after:
            bad = json.dumps({"type": "heartbeat", "seq": "not-a-number"}).encode()
            out.write(HEADER.pack(2, 0, len(bad)) + bad)
            injected = True
    if injected:
        out.write(buf)
    out.flush()
