"""Issue 34.5, verified with real TensorFlow: a ``BackupAndRestore`` backup written by 3 MWMS workers is
resumed by 2 and by 4 workers at the right epoch, with the same weights, bit for bit (and the optimizer's
step count). Each worker is a local process over loopback (tests/tf_backup_probe.py); every resume starts
from its own copy of the 3-worker backup, as tfcluster seeds each attempt."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _env

pytestmark = pytest.mark.e2e

PROBE = Path(__file__).with_name("tf_backup_probe.py")
STOP_AFTER = 2


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_workers(n: int, backup: Path, *extra: str) -> list[dict]:
    """``n`` MWMS workers to their end; each one's JSON line."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}
    procs = []
    for i in range(n):
        env = {
            **_env(),
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_NUM_INTEROP_THREADS": "1",
            "TF_NUM_INTRAOP_THREADS": "1",
        }
        argv = [sys.executable, str(PROBE), "--backup", str(backup), *extra]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    lines = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=420)
            assert p.returncode == 0, err[-3000:]
            lines.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return lines


def test_a_backup_of_3_workers_resumes_on_2_and_on_4_at_its_epoch_with_the_same_weights(tmp_path):
    written = tmp_path / "written"
    trained = run_workers(3, written, "--stop-after", str(STOP_AFTER))
    assert {t["epoch"] for t in trained} == {STOP_AFTER} and {t["workers"] for t in trained} == {3}
    assert {t["iterations"] for t in trained} == {STOP_AFTER * 5}  # 5 steps per epoch
    weights = {t["weights"] for t in trained}
    assert len(weights) == 1  # every replica holds the same weights (MWMS keeps them in sync)
    assert (written / "chief" / "checkpoint").is_file()
    for n in (2, 4):
        backup = tmp_path / f"resume-{n}"
        shutil.copytree(written, backup)
        resumed = run_workers(n, backup)
        assert {r["workers"] for r in resumed} == {n}
        # fit starts at the epoch after the last backed-up one (0-based: STOP_AFTER), not at 0
        assert {r["epoch"] for r in resumed} == {STOP_AFTER}, resumed
        assert {r["weights"] for r in resumed} == weights, (n, resumed, trained)  # bit-identical at restore
        assert {r["iterations"] for r in resumed} == {t["iterations"] for t in trained}
