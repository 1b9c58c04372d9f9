"""The README's first command: `tfcluster demo` trains a real 3-worker MWMS job over SSH on a
throwaway test bed, gathers the chief's checkpoint, explains the run, and leaves nothing behind."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from conftest import PY, REPO, _env

from tfcluster_testbed import MARKER_ENV

pytestmark = pytest.mark.e2e


def _testbed_pids() -> set[int]:
    pids = set()
    for p in psutil.process_iter():
        try:
            if MARKER_ENV in p.environ():
                pids.add(p.pid)
        except psutil.Error:
            continue
    return pids


def _temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("tfcluster-*")}


def test_demo_runs_explains_and_cleans_up(tmp_path):
    before_pids, before_dirs = _testbed_pids(), _temp_dirs()
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [PY, "-m", "orchestrator", "demo", "--mode", "loopback", "--epochs", "2", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=str(REPO),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded"
    # live, prefixed logs of every worker on the terminal, and complete logs on disk
    for i in range(3):
        assert f"[worker:{i} 127.0.0." in r.stderr + r.stdout
        log = (run_dir / "logs" / f"worker-{i}.log").read_text()
        assert f"[worker:{i}] epoch 2/2" in log and f"[worker:{i}] done: 2 epoch(s)" in log
    # every worker's final step count is the steps its script ran (issue 31: 300 / 273 / 299 before)
    status = json.loads((run_dir / "status.json").read_text())
    for i in range(3):
        log = (run_dir / "logs" / f"worker-{i}.log").read_text()
        ran = sum(int(n) for n in re.findall(r"\] epoch \d+/\d+ loss=\S+ steps=(\d+)", log))
        assert ran == 200 and status["tasks"][f"worker:{i}"]["steps"] == ran, (i, ran, status["tasks"])
    summary = json.loads((run_dir / "checkpoints" / "summary.json").read_text())
    assert summary["epochs"] == 2 and len(summary["losses"]) == 2
    report = json.loads(
        subprocess.run(
            [PY, "-m", "orchestrator", "report", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            cwd=str(REPO),
        ).stdout
    )
    assert report["split"] is not None and 0 < report["efficiency"] <= 1
    assert set(report["workers"]) == {"worker:0", "worker:1", "worker:2"}
    assert _testbed_pids() <= before_pids, "the demo left test bed processes behind"
    assert _temp_dirs() <= before_dirs, "the demo left its temporary directories behind"
