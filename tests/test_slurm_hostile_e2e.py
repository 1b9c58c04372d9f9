"""The connect-back port under attack during a real local Slurm job (slurmctld + three slurmd here).

A slowloris holds 300 unauthenticated connections on the batch supervisor's port, trickling a byte at a
time and reconnecting whenever one is closed; the job's second attempt (a new srun step) must still get
every task in and succeed, the refusals must be in events.jsonl and `status`, and no process of the job
(srun, slurmstepd, worker_entry, the task) may carry the run's secret in its environment.
"""

from __future__ import annotations

import json
import sys

import psutil
import pytest
from netattack import Slowloris
from slurm_fixtures import REPO, cli, events, finish, launch_argv, result, start, tasks_saying, write_spec
from waiting import wait_for

pytestmark = pytest.mark.e2e

#: Prints which processes hold TFCLUSTER_SECRET in their environment (the way the secret used to travel).
SCAN = (
    "import glob\n"
    "bad = []\n"
    "for path in glob.glob('/proc/[0-9]*/environ'):\n"
    "    try:\n"
    "        if b'TFCLUSTER_SECRET' in open(path, 'rb').read():\n"
    "            bad.append(path.split('/')[2])\n"
    "    except OSError:\n"
    "        pass\n"
    "print('environ scan:', ' '.join(bad) or 'clean')\n"
)


def _supervisor_port(run_dir) -> int | None:
    """The batch supervisor's listening port (its only one: no metrics port in this spec)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "slurm-batch" in cmd and str(run_dir) in cmd:
            try:
                ports = [c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                return None
            return ports[0] if ports else None
    return None


def test_a_slowloris_on_the_connect_back_port_neither_delays_nor_fails_a_slurm_job(slurm, tmp_path):
    flag = tmp_path / "attack-ready"
    script = (
        f'if [ "$TFCLUSTER_ATTEMPT" = 0 ]; then while [ ! -e {flag} ]; do sleep 0.1; done; exit 1; fi\n'
        f'exec {sys.executable} -c "$0"'
    )
    spec = write_spec(tmp_path / "spec.yaml", "sl-loris", ["sh", "-c", script, SCAN], restart={"max_restarts": 1})
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir), cwd=REPO)
    try:
        port = wait_for(lambda: _supervisor_port(run_dir), 120, "the batch supervisor's connect-back port")
        wait_for(lambda: sum(e["event"] == "task_ready" for e in events(run_dir)) == 3, 120, "attempt 0's tasks")
        with Slowloris(port, 300) as attack:
            attack.wait_greeted()
            # the condition asserted below: every one of the 300 slow handshakes dropped past its deadline
            wait_for(lambda: attack.closed_on_us >= 300, 90, "the supervisor to drop all 300 slow handshakes")
            # and the event saying so: connection_refused is rate-limited (the first at once, then one per
            # 10 s summing up), so the refusals after the first event are told only by a later one, which
            # a short attempt 1 could end the job before
            wait_for(
                lambda: any(e["event"] == "connection_refused" and e["total"] >= 300 for e in events(run_dir)),
                60,
                "a connection_refused event counting all 300 refusals",
            )
            flag.touch()  # attempt 0 fails; attempt 1's srun step dials in through the attack (reconnected)
            rc, out, err = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded" and res["restarts"] == 1
    assert len(tasks_saying(out, "environ scan: clean")) == 3, out[-3000:]  # one line, or one per task
    evs = events(run_dir)
    refused = [e for e in evs if e["event"] == "connection_refused"]
    assert refused and refused[-1]["total"] >= 300 and refused[0]["reason"] == "handshake not completed in time"
    start_1 = next(e["ts"] for e in evs if e["event"] == "attempt_started" and e["attempt"] == 1)
    ready_1 = [e["ts"] for e in evs if e["event"] == "task_ready" and e["ts"] >= start_1]
    assert len(ready_1) == 3
    print(f"\nattempt 1: every task ready {max(ready_1) - start_1:.2f} s after its start, under 300 slow connections")
    status = json.loads(cli(slurm, REPO, "status", str(run_dir), "--json").stdout)
    assert status["refused_connections"]["count"] >= 300
    assert "handshake not completed in time" in cli(slurm, REPO, "status", str(run_dir)).stdout


def test_the_secret_reaches_the_tasks_on_stdin_only(slurm, tmp_path):
    """While the step runs, no process on the machine has TFCLUSTER_SECRET in its environment."""
    spec = write_spec(tmp_path / "spec.yaml", "sl-env", [sys.executable, "-c", SCAN])
    rc, out, err = finish(start(slurm, launch_argv(spec, tmp_path / "run"), cwd=REPO), timeout=150)
    assert rc == 0, err[-3000:]
    assert len(tasks_saying(out, "environ scan: clean")) == 3, out[-3000:]  # one line, or one per task
