"""A flooding task against a small run directory, over real SSH (issue 31, item 8).

Before: one task printing at full speed grew the run directory by 4.3 GB in 30 s, the launcher's RSS
went from 70 to 576 MiB and on, and on a full disk the run "succeeded" without result.json (``status``:
launcher gone, last state starting). Now: the task's output is cut at ``logs.max_bytes_per_task`` (its
log says so, a ``log_cut`` event, the node keeps the whole of it and the gather leaves it there); the
launcher's input queue is bounded in bytes, so its memory stays bounded while the flood goes on; and
on a disk the flood filled, result.json and status.json are still written (the run's reserve).

The run directory is a real tmpfs mounted for the test (root), unmounted after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import psutil
import pytest
from conftest import PY, assert_no_job_processes, read_events, run_cli, start_launch

pytestmark = pytest.mark.e2e

SECS = 8
FLOOD = [
    PY,
    "-c",
    "import os, time\n"
    "i = os.environ['TFCLUSTER_TASK_INDEX']\n"
    "block = ((f'w{i} ' + 'x' * 1000 + '\\n') * 64).encode()\n"
    f"end, n = time.time() + ({SECS} if i == '1' else 0), 0\n"
    "while time.time() < end:\n"
    "    os.write(1, block); n += 64\n"
    f"time.sleep(1 if i == '1' else {SECS})\n"
    "print(f'w{i} done after {n} flood lines', flush=True)\n",
]


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mounted = []

    def mount(size: str):
        mnt = tmp_path / f"fs-{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)], capture_output=True
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _used(path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _follow(proc, fs, every=0.2):
    """While the launcher runs: its largest RSS, the least free space of ``fs``; then its stderr."""
    peak, least = 0, _free(fs)
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.Error:
            break
        least = min(least, _free(fs))
        time.sleep(every)
    _, err = proc.communicate(timeout=120)
    return peak, least, err


def test_a_flood_is_cut_at_the_cap_and_the_launcher_stays_bounded(testbed_factory, tmp_path, tmpfs):
    tb = testbed_factory(2)
    fs = tmpfs("256m")
    cap = 4 << 20
    spec = tb.write_spec(tmp_path / "spec.yaml", "flood", FLOOD, logs={"max_bytes_per_task": cap})
    run = fs / "run"
    proc = start_launch(tb, spec, run, "-q")
    try:
        peak, _, err = _follow(proc, fs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    log = (run / "logs" / "worker-1.log").read_bytes()
    assert cap - 2000 <= len(log) <= cap + 300  # the lines that fit under the cap, and the line that says so
    assert b"worker:1's output is cut here: it passed logs.max_bytes_per_task (4194304 bytes)" in log
    assert b"w1 done" not in log
    assert (run / "logs" / "worker-0.log").read_text().startswith("w0 done")
    cuts = [e for e in read_events(run) if e["event"] == "log_cut"]
    assert [(e["task"], e["limit"], e["attempt"]) for e in cuts] == [("worker:1", cap, 0)]
    result = json.loads((run / "result.json").read_text())
    assert result["state"] == "succeeded"
    assert result["gather"]["logs"]["worker:1"].startswith("cut by logs.max_bytes_per_task; the node keeps")
    # the node kept every line: far more than the cap, ending with the task's last line
    node_logs = list((tb._dir / "remote").rglob("worker-1/attempt-0/output.log"))
    (node_log,) = node_logs
    assert node_log.stat().st_size > 4 * cap
    with open(node_log, "rb") as f:
        f.seek(-200, 2)
        assert b"w1 done after" in f.read()
    assert _used(fs) < 3 * cap + (16 << 20)  # the run directory: the cap, not the flood
    assert peak < 300 << 20, f"launcher RSS peaked at {peak >> 20} MiB"
    assert not (run / ".reserve").exists()  # the run is recorded: its reserve went back to the disk
    assert_no_job_processes(tb, 10)


def test_on_a_disk_the_flood_filled_the_run_is_still_recorded(testbed_factory, tmp_path, tmpfs):
    tb = testbed_factory(2)
    fs = tmpfs("24m")
    spec = tb.write_spec(tmp_path / "spec.yaml", "full", FLOOD, logs={"max_bytes_per_task": None})
    run = fs / "run"
    proc = start_launch(tb, spec, run, "-q")
    try:
        _, least, err = _follow(proc, fs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # the job succeeded; the gather could not complete the logs (exit 5): the disk is full, and says so
    assert proc.returncode == 5 and "job succeeded" in err, err[-3000:]
    assert "not enough space" in err
    assert least < (64 << 10)  # the flood filled the disk, and nothing freed it for the end of the run
    result = json.loads((run / "result.json").read_text())
    assert result["state"] == "succeeded" and "No space left" in result["run_dir_error"]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "succeeded" and status.get("finished")
    shown = run_cli("status", str(run), tb=tb)
    assert shown.returncode == 0 and "succeeded" in shown.stdout and "gone" not in shown.stdout, shown.stdout
    assert_no_job_processes(tb, 10)
