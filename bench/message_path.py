#!/usr/bin/env python3
"""The launcher's CPU per message, without the network: the decision loop's per-message work alone.

    python bench/message_path.py [--tasks 1024] [--seconds 20] [--vs TREE] [--rounds 3] [--json]

The launcher's own classes over ``--tasks`` tasks, in one process: each task's ``TaskSession`` decodes
and validates the load generator's frames (``tfcluster_testbed.loadgen``'s heartbeat every second with
progress and host samples, a step-clock window every 5 s), ``Observations`` feeds the ``Monitor``, the
``Figures`` and heartbeats.jsonl (a real ``HeartbeatFile``), and once a simulated second the
``Reporter`` builds the status snapshot that ``StatusWriter`` writes to status.json — what
``Supervisor._handle_item`` and its status tick do for every message. Not in it: the channel pump's
reads, the sealed channels, pings, log lines, the TensorBoard thread (docs/benchmarks.md §11 profiles
the whole launcher). Time is simulated (no sleeping), so the figure is CPU (``time.process_time``)
per message, which the load of a shared box moves far less than wall time or CPU %.

``--vs TREE`` runs the very same script in another checkout (``git archive REV | tar -x -C TREE``),
the two in turn, ``--rounds`` times: the ratio of their medians is the change.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("TFC_BENCH_TREE") or REPO)  # the checkout measured (``--vs`` runs this script there)


class NoRefusals:
    """The reporter's refusals source: none in a bench."""

    def refusals(self) -> None:
        return None


def running(tasks: int):
    """The measured tree's classes over ``tasks`` running tasks: (spec, plan, sessions, monitor, figures,
    snapshots), as after hello, go and spawned (also ``launcher_parts.py``'s starting point)."""
    sys.path.insert(0, str(TREE))
    sys.path.insert(0, str(TREE / "tests"))
    from loadfleet import load_plan

    from orchestrator.core.states import TaskState
    from orchestrator.supervise.figures import Figures
    from orchestrator.supervise.monitor import Monitor, Policy
    from orchestrator.supervise.session import TaskSession
    from orchestrator.supervise.status import Snapshots
    from worker_entry import protocol as p

    loaded, plan = load_plan(tasks, profile_s=5.0)
    sessions = {str(n.task): TaskSession(n, 0) for n in plan.nodes}
    for s in sessions.values():
        s.state = TaskState.RUNNING  # as after hello, go and spawned
        s.decoder.feed(p.MARKER)  # the node's marker came before its hello
    monitor = Monitor(list(sessions), Policy.from_spec(loaded.spec, plan.policy), 0.0)
    monitor.arm(0.0)
    figures = Figures()
    return loaded, plan, sessions, monitor, figures, Snapshots(sessions, figures)


def measure(tasks: int, seconds: int) -> dict[str, float]:
    """µs of CPU per message over ``seconds`` simulated seconds of ``tasks`` running tasks."""
    _, _, sessions, monitor, figures, snapshots = running(tasks)
    from orchestrator.core.states import JobState
    from orchestrator.events import EventBus
    from orchestrator.runs import RunDir
    from orchestrator.sinks.files import HeartbeatFile
    from orchestrator.sinks.status import StatusWriter
    from orchestrator.supervise.observe import Observations
    from orchestrator.supervise.reporting import Reporter
    from worker_entry import protocol as p

    t0 = time.time()
    bus = EventBus([])
    with tempfile.TemporaryDirectory(prefix="tfc-msgpath-") as tmp:
        heartbeats = HeartbeatFile(Path(tmp) / "heartbeats.jsonl")
        status = StatusWriter(RunDir(Path(tmp)), "bench", "bench", None, figures)
        observed = Observations(monitor, bus, heartbeats, figures, snapshots, attempt=0)
        reporter = Reporter(snapshots, monitor, NoRefusals(), bus, attempt=0)  # type: ignore[arg-type]
        frames = [  # made before the clock starts: the node's work is not the launcher's
            [
                _heartbeat(p, sec, t0 + sec) + (_profile(p, t0 + sec) if (i + sec) % 5 == 0 and sec >= 5 else b"")
                for i in range(len(sessions))
            ]
            for sec in range(seconds)
        ]
        messages = 0
        cpu0 = time.process_time()
        for sec in range(seconds):
            for (name, s), data in zip(sessions.items(), frames[sec], strict=True):
                snapshots.touch(name)
                for m in s.receive(data, b""):
                    if not isinstance(m, p.Message):  # a protocol error or noise: the bench is broken
                        raise RuntimeError(f"{name}: {m!r}")
                    messages += 1
                    observed.message(s, m, float(sec))
            monitor.check(float(sec))  # the loop's 10 Hz check, once per simulated second here
            reporter.publish(status, JobState.RUNNING, None)
        cpu = time.process_time() - cpu0
        heartbeats.close()
    return {"us_per_message": round(1e6 * cpu / messages, 1), "messages": messages, "cpu_s": round(cpu, 2)}


def _heartbeat(p, sec: int, ts: float) -> bytes:
    steps = 20 * sec
    return p.msg_frame(
        {
            "type": "heartbeat",
            "seq": sec + 1,
            "ts": ts,
            "load1": 0.5,
            "state": "running",
            "cpu_pct": 95.0,
            "cpu_s": float(sec),
            "rss_mb": 512.0,
            "threads": 40,
            "nproc": 1,
            "progress": {
                "steps": steps,
                "epoch": steps // 1000,
                "examples": steps * 64,
                "step_time_s": 0.05,
                "phase": "train",
                "ts": ts,
            },
            "host": {
                "interval_s": 1.0,
                "threads": 40,
                "run_ms": 950.0,
                "wait_ms": 5.0,
                "wait_pct": 0.5,
                "steal_pct": 0.0,
            },
        }
    )


def _profile(p, ts: float) -> bytes:
    parts = {
        "input_ms": 2.0,
        "compute_ms": 30.0,
        "collective_ms": 12.0,
        "update_ms": 3.0,
        "host_ms": 2.0,
        "other_ms": 1.0,
    }
    return p.msg_frame(
        {
            "type": "profile",
            "steps": 100,
            "ts": ts,
            "source": "stepclock",
            "step_ms": 50.0,
            "pre_collective_ms": 38.0,
            "cpu_ms": 28.0,
            "step_p50_ms": 50.0,
            "stamps": "launch",
            **parts,
        }
    )


def main() -> int:
    from inturn import in_turn, parser

    ap = parser(__doc__, tasks=1024, seconds=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if (runs := in_turn(__file__, args, measure)) is None:
        return 0
    us = {k: [r["us_per_message"] for r in v] for k, v in runs.items()}
    result = {k: {"runs": v, "median": statistics.median(v)} for k, v in us.items()}
    if args.vs:
        result["ratio"] = round(result["this"]["median"] / result["vs"]["median"], 3)
    result["load"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
