"""``report --json`` keeps its shape while the model behind it changes: the keys, their nesting and the
JSON types of a real report (tests/data/recorded_run, with gradient norms and a training loss added to
its records, and with mixed GPU models for the pace section) are pinned in tests/data/report_shape.json,
written from the report before its parts became dataclasses. A part that changes the JSON fails here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from test_noise_scale import synthetic_run

from orchestrator.runs import RunDir
from orchestrator.views.report import build_report

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "report_shape.json"
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"


def shape(x: Any) -> Any:
    """The keys (in order), nesting and JSON types of a value; a list by the shapes of its items, once each."""
    if isinstance(x, dict):
        return {"{}": [[k, shape(v)] for k, v in x.items()]}
    if isinstance(x, list):
        seen: list[Any] = []
        for item in x:
            if (s := shape(item)) not in seen:
                seen.append(s)
        return {"[]": seen}
    if isinstance(x, bool) or x is None:
        return type(x).__name__
    if isinstance(x, (int, float)):
        return type(x).__name__
    return "str"


def rich_run(path: Path) -> RunDir:
    """The recorded run with each worker's step-clock windows carrying gradient norms, its progress a
    training loss, and two GPU models (the first host slower)."""
    shutil.copytree(DATA / "recorded_run", path)
    beats = [json.loads(line) for line in (path / "heartbeats.jsonl").read_text().splitlines() if line.strip()]
    rng = np.random.default_rng(3)
    noisy = synthetic_run(rng.standard_normal(8) * 0.3, np.eye(8), workers=3, local=1, steps=1300, window=100)
    done: dict[str, int] = {}
    for b in beats:
        task = b.get("task")
        if b.get("kind") == "profile":
            i = done.get(task, 0)
            done[task] = i + 1
            b["noise"] = noisy[task][min(i, len(noisy[task]) - 1)]["noise"]
        elif isinstance(b.get("progress"), dict) and b["progress"].get("steps"):
            steps = b["progress"]["steps"]
            b["progress"]["loss"] = {"sum": 2.0 * steps - steps**2 / 1000.0, "steps": steps, "source": "user"}
    (path / "heartbeats.jsonl").write_text("".join(json.dumps(b) + "\n" for b in beats))
    events = [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines() if line.strip()]
    for e in events:
        if e.get("event") == "task_ready":
            e["gpus"] = [{"name": A100 if e.get("task") == "worker:0" else H100, "memory_mb": 81920}]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return RunDir(path)


def shapes(tmp_path: Path) -> dict[str, Any]:
    rich = rich_run(tmp_path / "rich")
    return {
        "recorded": shape(build_report(RunDir(DATA / "recorded_run")).to_dict()),
        "rich": shape(build_report(rich).to_dict()),
        "rich_last": shape(build_report(rich, last_s=3.0).to_dict()),
    }


def test_report_json_keeps_its_keys_nesting_and_types(tmp_path):
    got = shapes(tmp_path)
    rich = got["rich"]["{}"]
    assert {k for k, v in rich if v != "NoneType"} >= {"split", "pace", "goodput", "loss", "noise_scale"}, rich
    assert got == json.loads(GOLDEN.read_text())


def test_report_json_round_trips_through_json(tmp_path):
    """What --json prints reads back to the same value (no tuple, no dataclass left in it)."""
    data = build_report(rich_run(tmp_path / "rich")).to_dict()
    assert json.loads(json.dumps(data)) == data


if __name__ == "__main__":  # python3 tests/test_report_json_shape.py DIR: (re)write the golden file
    import sys

    GOLDEN.write_text(json.dumps(shapes(Path(sys.argv[1])), indent=1) + "\n")
