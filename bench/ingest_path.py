#!/usr/bin/env python3
"""The launcher's ingest path alone: CPU per message from the sealed bytes to the heartbeats.jsonl line.

    python bench/ingest_path.py [--tasks 1024] [--seconds 10] [--vs TREE] [--rounds 3]

What the channel pump and the decision loop do for each record a node sends, in one process, with the
launcher's own classes: ``Opener.feed`` of the sealed record (``SocketChannel.read`` without the
socket), the pump's ``Received``, ``TaskSession.receive`` (frames, decoding, validation, the order
checks), ``record_of`` and the heartbeats.jsonl line (a real ``HeartbeatFile``). The messages are
``bench/message_path.py``'s: a heartbeat a task a second, a step-clock window every 5 s, sealed before
the clock starts (the node's work is not the launcher's). Not in it: the figures, the monitor, the status
snapshot, TensorBoard (``message_path.py`` and ``launcher_cpu.py`` have them). CPU by
``time.process_time``; ``--vs TREE`` runs the same script in another checkout, the two in turn.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
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
    wire = [
        [
            sealers[i].seal(
                _heartbeat(p, sec, t0 + sec) + (_profile(p, t0 + sec) if (i + sec) % 5 == 0 and sec >= 5 else b"")
            )
            for i in range(len(sessions))
        ]
        for sec in range(seconds)
    ]
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
    return {"us_per_message": round(1e6 * cpu / messages, 2), "messages": messages}


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--vs", help="another checkout of the repository: the same measurement there, in turn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.tasks, args.seconds)))
        return 0
    trees = {"this": REPO, **({"vs": Path(args.vs).resolve()} if args.vs else {})}
    runs: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree), "TFC_BENCH_TREE": str(tree)}
            argv = [sys.executable, __file__, "--one", "--tasks", str(args.tasks), "--seconds", str(args.seconds)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=900)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1])["us_per_message"])
    for name, v in runs.items():
        print(f"{name}: {v} median {statistics.median(v)} us a message")
    if args.vs:
        print(f"ratio: {round(statistics.median(runs['this']) / statistics.median(runs['vs']), 3)}")
    print(f"load: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
