#!/usr/bin/env python3
"""The launcher's per-task state and per-second scans, part by part: µs of CPU per record each.

    python bench/launcher_parts.py [--tasks 4096] [--seconds 12] [--vs TREE] [--rounds 3] [--json]

``bench/message_path.py`` times the decision loop's whole per-message path (decoding included); this
times only what comes after it, each part alone, so a change to one shows: ``figures`` (``Figures.add``
of every heartbeats.jsonl record), ``monitor_in`` (``Monitor.on_heartbeat`` / ``on_profile``, the
straggler round with ``evidence`` included), ``snapshot`` (``Reporter.publish``: ``Snapshots.build`` and
``StatusWriter`` writing status.json, once a simulated second), ``check`` (``Monitor.check`` at the
loop's 10 Hz) and ``pings`` (``Pings.tick`` at 10 Hz, the sealing left out: a session that sends
nothing). The records are the load generator's (``message_path``'s frames: a heartbeat a task a second
with progress and host samples, a step-clock window every 5 s), decoded before the clock starts. Time
is simulated; CPU by ``time.process_time``; the collector frozen as in the launcher (``supervise.heap``).
``--vs TREE``: the same script in another checkout, in turn, ``--rounds`` times.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("TFC_BENCH_TREE") or REPO)
PARTS = ("figures", "monitor_in", "snapshot", "check", "pings")


def measure(tasks: int, seconds: int) -> dict[str, float]:
    sys.path.insert(0, str(REPO / "bench"))
    from message_path import NoRefusals, _heartbeat, _profile, running

    _, _, sessions, monitor, figures, snapshots = running(tasks)
    from orchestrator.core.states import JobState
    from orchestrator.events import EventBus
    from orchestrator.runs import RunDir
    from orchestrator.sinks.status import StatusWriter
    from orchestrator.supervise.pings import Pings
    from orchestrator.supervise.reporting import Reporter
    from orchestrator.supervise.session import record_of
    from worker_entry import protocol as p

    t0 = time.time()
    seconds_in = []  # per simulated second: [(task, message, record)] decoded before the clock starts
    for sec in range(seconds):
        batch = []
        for i, (name, s) in enumerate(sessions.items()):
            data = _heartbeat(p, sec, t0 + sec) + (_profile(p, t0 + sec) if (i + sec) % 5 == 0 and sec >= 5 else b"")
            for m in s.receive(data, b""):
                if isinstance(m, p.Heartbeat):
                    batch.append((name, m, {**record_of(m), "attempt": 0}))
                elif isinstance(m, p.Profile):
                    batch.append((name, m, record_of(m)))
        seconds_in.append(batch)
    pings = Pings(list(sessions), 3.0, 0.0)
    for s in sessions.values():
        s.send = lambda msg: True  # type: ignore[method-assign]  # the sealing is the channel's, not timed here
    cpu = dict.fromkeys(PARTS, 0.0)
    clock = time.process_time
    records = 0
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory(prefix="tfc-parts-") as tmp:
        status = StatusWriter(RunDir(Path(tmp)), "bench", "bench", None, figures)
        reporter = Reporter(snapshots, monitor, NoRefusals(), EventBus([]), attempt=0)  # type: ignore[arg-type]
        for sec, batch in enumerate(seconds_in):
            now = float(sec)
            a = clock()
            for name, m, rec in batch:
                figures.add(name, rec if isinstance(m, p.Heartbeat) else {**rec, "kind": "profile", "attempt": 0})
            b = clock()
            for name, m, rec in batch:
                monitor.seen(name, now)
                if isinstance(m, p.Heartbeat):
                    monitor.on_heartbeat(name, m, now, rec)
                else:
                    monitor.on_profile(name, rec, now)
                snapshots.touch(name)
            c = clock()
            for k in range(10):
                monitor.check(now + k / 10)
            d = clock()
            for k in range(10):
                pings.tick(now + k / 10, sessions)
            e = clock()
            reporter.publish(status, JobState.RUNNING, None)
            f = clock()
            records += len(batch)
            for part, dt in zip(PARTS, (b - a, c - b, f - e, d - c, e - d), strict=True):
                cpu[part] += dt
    gc.unfreeze()
    out = {part: round(1e6 * v / records, 2) for part, v in cpu.items()}
    out["total"] = round(sum(out[p] for p in PARTS), 2)
    out["records"] = records
    return out


def main() -> int:
    from inturn import in_turn, parser

    ap = parser(__doc__, tasks=4096, seconds=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if (runs := in_turn(__file__, args, measure)) is None:
        return 0
    result: dict[str, object] = {
        k: {part: statistics.median(r[part] for r in v) for part in (*PARTS, "total")} for k, v in runs.items()
    }
    result["load"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"µs of CPU per record at {args.tasks} tasks (median of {args.rounds} runs), load {result['load']}")
        print(f"{'part':<12}" + "".join(f"{k:>10}" for k in runs))
        for part in (*PARTS, "total"):
            print(f"{part:<12}" + "".join(f"{result[k][part]:>10.2f}" for k in runs))  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main())
