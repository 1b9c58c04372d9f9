"""A synthetic 1,000-task run directory made from tests/data/recorded_run (3 real workers): each
task's records are those of the recorded worker it copies, renamed, with its step times scaled by a
spread of a few per cent; ``SLOW`` tasks are 3x slower and ``STRAGGLER`` is named by a straggler event."""

from __future__ import annotations

import copy
import json
from pathlib import Path

RECORDED = Path(__file__).parent / "data" / "recorded_run"
SLOW = {"worker:417": 3.0, "worker:808": 2.2}
STRAGGLER = "worker:417"
_MS = ("step_ms", "pre_collective_ms", "input_ms", "compute_ms", "collective_ms", "cpu_ms", "step_p50_ms")


def _scale(task: str, i: int) -> float:
    return SLOW.get(task, 1.0 + 0.04 * ((i * 37) % 11) / 10)


def big_run(dest: Path, n: int = 1000) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    plan = json.loads((RECORDED / "plan.json").read_text())
    base = plan["nodes"]
    plan["nodes"] = []
    for i in range(n):
        node = copy.deepcopy(base[i % len(base)])
        node["task"] = {"type": "worker", "index": i}
        node["host"] = node["ssh_host"] = f"10.1.{i // 250}.{i % 250 + 1}"
        plan["nodes"].append(node)
    (dest / "plan.json").write_text(json.dumps(plan))
    lines = []
    for raw in (RECORDED / "heartbeats.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        k = int(rec["task"].split(":")[1])
        for i in range(k, n, len(base)):
            task = f"worker:{i}"
            r = {**rec, "task": task}
            f = _scale(task, i)
            for key in _MS:
                if isinstance(r.get(key), (int, float)):
                    r[key] = round(r[key] * f, 3)
            if isinstance(r.get("progress"), dict) and r["progress"].get("step_time_s"):
                r["progress"] = {**r["progress"], "step_time_s": r["progress"]["step_time_s"] * f}
            lines.append(json.dumps(r, separators=(",", ":")))
    (dest / "heartbeats.jsonl").write_text("\n".join(lines) + "\n")
    events = [json.loads(x) for x in (RECORDED / "events.jsonl").read_text().splitlines()]
    events[0]["tasks"] = n
    mid = events[-4]["ts"] - 10
    events.insert(
        -3,
        {
            "ts": mid,
            "event": "straggler",
            "task": STRAGGLER,
            "host": "10.1.1.168",
            "message": f"{STRAGGLER} is 3.0x slower than the median worker",
            "wait_ms": 5.0,
            "step_ms": 27.9,
            "share": 0.2,
            "cause": "compute",
            "pre_collective_ms": {STRAGGLER: 7.5},
            "relative_score": 0.2,
        },
    )
    (dest / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = json.loads((RECORDED / "result.json").read_text())
    result["tasks"] = {f"worker:{i}": {**result["tasks"]["worker:0"], "task": f"worker:{i}"} for i in range(n)}
    (dest / "result.json").write_text(json.dumps(result))
    return dest
