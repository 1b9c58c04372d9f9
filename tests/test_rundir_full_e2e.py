"""The launcher's own disk fills up mid-run: the job keeps running, one warning, and nothing is lost —
the nodes keep their own logs and the hand-over completes the run directory from them."""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest
from conftest import PY, assert_no_job_processes, start_launch
from waiting import wait_for

pytestmark = pytest.mark.e2e

LINES = 6000
NOISY = [
    PY,
    "-c",
    f"import os, time\ni = os.environ['TFCLUSTER_TASK_INDEX']\nfor n in range({LINES}): print(f'w{{i}} line {{n:05d}} ' + 'x' * 80)\n"
    "import sys; sys.stdout.flush(); time.sleep(3); print(f'w{i} done', flush=True)",
]


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _open_files(pid: int) -> set[str]:
    try:
        return {os.path.realpath(f.path) for f in psutil.Process(pid).open_files()}
    except psutil.Error:
        return set()


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_run_directory_does_not_stop_the_job_and_loses_nothing(testbed_factory, tmp_path, small_fs):
    tb = testbed_factory(2)
    filler = small_fs / "filler"
    with open(filler, "wb") as f:  # leave ~1 MB: the job's output fills it within a second
        f.write(b"\0" * (7 << 20))
    spec = tb.write_spec(tmp_path / "spec.yaml", "full", NOISY)
    run = small_fs / "run"
    proc = start_launch(tb, spec, run, "-q")
    try:
        wait_for(lambda: _free(small_fs) < (64 << 10), 60, "the run directory's disk full")
        # full until each task's log has been refused (the launcher then closes it), however long the
        # launcher takes to write: both logs must be completed from the nodes' copies. (A task's log is
        # made at its first line: one not made yet is not refused yet.)
        logs = {os.path.realpath(run / "logs" / f"worker-{i}.log") for i in range(2)}

        def refused() -> bool:
            return all(os.path.exists(p) for p in logs) and not logs & _open_files(proc.pid)

        wait_for(refused, 60, "the full disk to refuse both task logs")
        filler.unlink()  # room again: the end of the run (result.json, the completed logs) must land
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert err.count("cannot write") == 1, err[-3000:]  # one warning, not one per line
    result = json.loads((run / "result.json").read_text())
    assert result["state"] == "succeeded" and "No space left" in result["run_dir_error"]
    for i in range(2):
        lines = (run / "logs" / f"worker-{i}.log").read_text().splitlines()
        assert len(lines) == LINES + 1 and lines[-1] == f"w{i} done"  # complete, from the node's copy
        assert result["gather"]["logs"][f"worker:{i}"].startswith("completed from the node")
    assert_no_job_processes(tb, 5)
