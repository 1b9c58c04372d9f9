"""The late-strategy hint (issue 32.6): the instrumentation recognises MWMS's "Collective ops must be
configured at program startup", sends a ``hint`` (a code and the script's line, never text), the agent
passes it on validated, and the launcher words it into the task's failure, an event, status and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, _env
from fakenode import FakeNode, healthy, obedient
from supervising import supervise

from orchestrator.sinks.console import describe
from orchestrator.supervise.hints import HINTS, hint_text
from orchestrator.views.control import status_text
from worker_entry import protocol as p
from worker_entry.agent.records import ProgressRecords

LATE = "create `MultiWorkerMirroredStrategy()` before any dataset, tensor or model"


def test_a_hint_is_validated_and_worded_by_the_launcher():
    h = p.parse_message(json.dumps({"type": "hint", "code": "late_strategy", "file": "train.py", "line": 12}).encode())
    assert isinstance(h, p.Hint) and hint_text(h) == f"{LATE} (line 12 of train.py)"
    assert hint_text(p.Hint(code="late_strategy")) == LATE == HINTS["late_strategy"]
    assert hint_text(p.Hint(code="late_strategy", file="x\x1b]0;t\x07.py")) == f"{LATE} (in x.py)"  # made safe
    for bad in ({"code": "rm -rf"}, {"code": "late_strategy", "line": 0}, {"code": "late_strategy", "file": "a" * 300}):
        with pytest.raises(p.ProtocolError):
            p.parse_message(json.dumps({"type": "hint", **bad}).encode())


def test_the_agent_passes_a_hint_record_on_as_a_message():
    sent: list = []
    records = ProgressRecords(sent.append, lambda b: None)
    records.feed(b'{"kind":"hint","ts":1.0,"code":"late_strategy","file":"train.py","line":5}\n')
    assert sent == [p.Hint(code="late_strategy", file="train.py", line=5, ts=1.0)]
    records.feed(b'{"kind":"hint","ts":1.0,"code":"other"}\n')  # not a known code: skipped, said once
    assert len(sent) == 1 and records.bad_records == 1


def _late(n: FakeNode) -> None:
    """A worker whose script built the strategy too late: the hint, then the exit."""
    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=2000 + n.node.task.index))
    n.log("RuntimeError: Collective ops must be configured at program startup", p.STDERR)
    n.send(p.Hint(code="late_strategy", file="train.py", line=7, ts=1.0))
    n.exited(1)


def test_the_failure_carries_the_fix_and_the_console_says_it_once():
    res, rec, _ = supervise({"worker:0": _late, "worker:1": _late, "worker:2": obedient})
    rc = res.root_cause
    assert rc.kind == "exit" and rc.hint == f"{LATE} (line 7 of train.py)", rc
    hints = rec.kinds("hint")
    assert len(hints) == 1 and (hints[0].code, hints[0].file, hints[0].line) == ("late_strategy", "train.py", 7)
    assert describe(hints[0]) == f"{hints[0].task} ({hints[0].host}): hint: {LATE} (line 7 of train.py)"
    shown = status_text({"job": "j", "state": "failed", "root_cause": rc.to_dict(), "tasks": {}})
    assert f"fix: {LATE} (line 7 of train.py)" in shown


def test_a_task_that_fails_without_a_hint_has_none():
    res, rec, _ = supervise({"worker:1": healthy(0.2, code=3)})
    assert res.root_cause.hint == "" and not rec.kinds("hint")


def test_the_instrumentation_names_the_scripts_line_under_real_tensorflow(tmp_path):
    """Real TF, the real hooks (sitecustomize): a dataset, then MWMS under a two-worker TF_CONFIG."""
    script = tmp_path / "train.py"
    script.write_text(
        "import tensorflow as tf\n"
        "ds = tf.data.Dataset.range(10)\n"
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    )
    r, w = os.pipe()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    env = {
        **_env(),
        "TFCLUSTER_PROGRESS_FD": str(w),
        "TFCLUSTER_INSTRUMENT": "1",
        "PYTHONPATH": f"{REPO / 'worker_entry' / '_site'}:{_env().get('PYTHONPATH', '')}",
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}),
    }
    proc = subprocess.Popen([sys.executable, str(script)], env=env, pass_fds=(w,), stderr=subprocess.PIPE)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        records = [json.loads(line) for line in pipe.read().splitlines()]
    err = proc.communicate(timeout=240)[1].decode()
    assert proc.returncode == 1 and "must be configured at program startup" in err
    hints = [x for x in records if x["kind"] == "hint"]
    assert [(h["code"], h["file"], h["line"]) for h in hints] == [("late_strategy", "train.py", 3)], records
