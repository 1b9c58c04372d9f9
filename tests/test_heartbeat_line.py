"""heartbeats.jsonl's line, its head encoded once per task (``HeartbeatFile``): byte for byte the
encoding of ``{"task": task, **record}`` it replaces, whatever the task's name and the record (empty,
naming a task itself, non-ASCII text, an integer only the standard library encodes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import fastjson
from orchestrator.sinks.files import HeartbeatFile

BEAT = {"seq": 4, "ts": 1795859258.176244, "cpu_pct": 95.0, "progress": {"steps": 60, "loss": None}, "attempt": 0}
RECORDS = [
    BEAT,
    {**BEAT, "kind": "profile"},
    {},
    {"task": "another", **BEAT},
    {**BEAT, "host": {"name": "nœud-1 ✓", "ctl": "\x01\x7f"}},
    {**BEAT, "seq": 10**30},  # past 64 bits: the standard library's spelling, for the whole line
]
TASKS = ["worker:0", "ps:12", "évaluateur", 'we"ird\\', "tab\there", ""]


@pytest.mark.parametrize("task", TASKS)
def test_a_line_is_the_whole_records_encoding(tmp_path: Path, task: str):
    f = HeartbeatFile(tmp_path / "heartbeats.jsonl")
    for rec in RECORDS * 2:  # (the second time, the task's head is the one kept)
        f.write(task, rec)
    f.close()
    want = b"".join(fastjson.dumps({"task": task, **rec}) + b"\n" for rec in RECORDS * 2)
    assert (tmp_path / "heartbeats.jsonl").read_bytes() == want
