#!/usr/bin/env python3
"""The launcher's ingest path alone: CPU per message from the sealed bytes to the heartbeats.jsonl line.

    python bench/ingest_path.py [--tasks 1024] [--seconds 10] [--vs TREE] [--rounds 3]

What the channel pump and the decision loop do for each record a node sends, in one process, with the
launcher's own classes: ``Opener.feed`` of the sealed record (``SocketChannel.read`` without the
socket), the pump's ``Received``, ``TaskSession.receive`` (frames, decoding, validation, the order
checks), ``record_of`` and the heartbeats.jsonl line (a real ``HeartbeatFile``); and ``parse_message``
alone over the same messages, as the session calls it (``parse_us``). The messages are
``bench/message_path.py``'s: a heartbeat a task a second, a step-clock window every 5 s, sealed before
the clock starts (the node's work is not the launcher's). Not in it: the figures, the monitor, the status
snapshot, TensorBoard (``message_path.py`` and ``launcher_cpu.py`` have them). CPU by
``time.process_time``; ``--vs TREE`` runs the same script in another checkout, the two in turn.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("TFC_BENCH_TREE") or REPO)


def measure(tasks: int, seconds: int) -> dict[str, float]:
    sys.path.insert(0, str(TREE))
    sys.path.insert(0, str(TREE / "tests"))
    sys.path.insert(0, str(REPO / "bench"))
    from loadfleet import load_plan
    from message_path import _heartbeat, _profile

    from orchestrator.core.states import TaskState
    from orchestrator.sinks.files import HeartbeatFile
    from orchestrator.supervise.inputs import Received
    from orchestrator.supervise.session import TaskSession, record_of
    from worker_entry import protocol as p
    from worker_entry.protocol.seal import Opener, Sealer

    _, plan = load_plan(tasks, profile_s=5.0)
    sessions = [TaskSession(n, 0) for n in plan.nodes]
    keys = [bytes([i % 256]) * 32 for i in range(len(sessions))]
    sealers = [Sealer(k) for k in keys]
    openers = [Opener(k) for k in keys]
    for s in sessions:
        s.state = TaskState.RUNNING
        s.decoder.feed(p.MARKER)
    t0 = time.time()
    plain = [
        [
            _heartbeat(p, sec, t0 + sec) + (_profile(p, t0 + sec) if (i + sec) % 5 == 0 and sec >= 5 else b"")
            for i in range(len(sessions))
        ]
        for sec in range(seconds)
    ]
    wire = [[sealers[i].seal(data) for i, data in enumerate(sec)] for sec in plain]
    with tempfile.TemporaryDirectory(prefix="tfc-ingest-") as tmp:
        out = HeartbeatFile(Path(tmp) / "heartbeats.jsonl")
        messages = 0
        cpu0 = time.process_time()
        for sec in range(seconds):
            if sec == 1:  # the first second warms up (each class's generated reader is built on first use)
                messages, cpu0 = 0, time.process_time()
            for s, opener, data in zip(sessions, openers, wire[sec], strict=True):
                item = Received(s.task, opener.feed(data), b"", False)
                for m in s.receive(item.out, item.err):
                    if not isinstance(m, p.Message):
                        raise RuntimeError(f"{s.task}: {m!r}")
                    messages += 1
                    out.write(s.task, {**record_of(m), "attempt": 0})
        cpu = time.process_time() - cpu0
        out.close()
    return {"us_per_message": round(1e6 * cpu / messages, 2), "messages": messages, **parse_alone(p, plain)}


def parse_alone(p, plain: list[list[bytes]]) -> dict[str, float]:
    """``parse_message`` alone, as the session calls it (with ``fastdecode.READ`` where the tree has it),
    over the same messages after the first second: what decoding and validating one costs."""
    from orchestrator.core import fastjson

    try:
        from orchestrator.core.fastdecode import READ

        extra: tuple = (READ,)
    except ImportError:  # a tree before it
        extra = ()
    payloads = [f.payload for sec in plain[1:] for data in sec for f in p.FrameDecoder(synced=True).feed(data)]
    cpu0 = time.process_time()
    for payload in payloads:
        p.parse_message(payload, fastjson.loads, *extra)
    return {"parse_us": round(1e6 * (time.process_time() - cpu0) / len(payloads), 2)}


def main() -> int:
    from inturn import in_turn, parser

    args = parser(__doc__, tasks=1024, seconds=10).parse_args()
    if (runs := in_turn(__file__, args, measure)) is None:
        return 0
    for key, what in (("us_per_message", "us a message"), ("parse_us", "us a message parsed alone")):
        us = {k: [r[key] for r in v] for k, v in runs.items()}
        for name, v in us.items():
            print(f"{name}: {v} median {statistics.median(v)} {what}")
        if args.vs:
            print(f"ratio: {round(statistics.median(us['this']) / statistics.median(us['vs']), 3)}")
    print(f"load: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
