"""Roles under a real Slurm (slurmctld + three slurmd on this machine), real TensorFlow on CPU:

- ParameterServerStrategy from ``slurm.roles`` (1 chief running a ClusterCoordinator loop, 2 workers,
  1 ps: one srun step of 4 tasks on 2 nodes): a worker SIGKILLed mid-run is restarted in place — a
  one-task step on its node (``srun --overlap``) that dials back as its old rank and gets the same
  TF_CONFIG, at its old port — and the job succeeds when the chief ends;
- MWMS with a sidecar evaluator: the evaluator (outside the cluster) evaluates, the job succeeds.

Inside an allocation (salloc) so the test pays for one step, not a batch job. Few and short on purpose.
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from slurm_fixtures import PY, REPO, events, finish, launch_argv, result, start, write_spec
from test_roles_e2e import PS_LOOP, _log, _pid  # the same job's log and pid readers
from waiting import wait_for

pytestmark = pytest.mark.e2e


def _tf_configs(run_dir, task: str) -> list[dict]:
    """TF_CONFIG of each incarnation of ``task`` (the workload prints it first)."""
    text = _log(run_dir, task.replace(":", "-"))
    return [json.loads(line.split("TF_CONFIG ", 1)[1]) for line in text.splitlines() if "TF_CONFIG {" in line]


def _show_tf_config(cmd: list[str]) -> list[str]:
    return ["sh", "-c", 'echo "TF_CONFIG $TF_CONFIG"; exec "$0" "$@"', *cmd]


def test_ps_worker_sigkilled_under_slurm_is_restarted_in_place_and_the_job_succeeds(slurm, tmp_path):
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-ps",
        # 600 steps: ~20 s after the kill, so the restart (a TF import, >10 s on a loaded 2-core box) is
        # back before the chief ends (as test_roles_e2e's PS kill test; at 240 it failed here, base code too)
        _show_tf_config([*PS_LOOP, "--steps", "600", "--step-ms", "40"]),
        slurm={"nodes": 2, "tasks_per_node": 2, "roles": {"chief": 1, "worker": 2, "ps": 1}},
        tensorflow={"strategy": "parameter_server"},
        job={"stop_grace_s": 2},
    )
    run_dir = tmp_path / "run"
    argv = [
        "salloc",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--immediate=30",
        *launch_argv(spec, run_dir, "-q", "--no-gather"),
    ]
    proc = start(slurm, argv, cwd=REPO)
    try:
        wait_for(lambda: "step 20/" in _log(run_dir, "chief-0"), 180, "the coordinator's first steps")
        os.kill(_pid(run_dir, "worker:1"), signal.SIGKILL)
        rc, _out, err = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded" and res["root_cause"] is None
    evs = events(run_dir)
    (rf,) = [e for e in evs if e["event"] == "role_failure"]
    assert (rf["task"], rf["kind"], rf["action"], rf["restarts"]) == ("worker:1", "signal", "restart", 1)
    assert len([e for e in evs if e["event"] == "task_spawned" and e["task"] == "worker:1"]) == 2
    assert "step 600/600" in _log(run_dir, "chief-0")
    first, again = _tf_configs(run_dir, "worker:1")
    assert first == again  # the same cluster, the same place: its old address and port
    assert first["task"] == {"type": "worker", "index": 1} and set(first["cluster"]) == {"chief", "worker", "ps"}
    assert _log(run_dir, "worker-1").count("server up at") == 2
    assert res["tasks"]["chief:0"]["state"] == "succeeded"
    assert {res["tasks"][t]["state"] for t in ("worker:0", "worker:1", "ps:0")} == {"stopped"}
    assert (run_dir / "slurm" / "srun-attempt-0-worker-1-restart-1.log").exists()
    wait_for(lambda: not slurm.processes(), 15, "every task process to be gone")


def test_mwms_with_a_sidecar_evaluator_under_slurm(slurm, tmp_path):
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-eval",
        [
            PY,
            "-m",
            "worker_entry.examples.sidecar_eval",
            "--epochs",
            "3",
            "--steps-per-epoch",
            "10",
            "--epoch-sleep-s",
            "2",
        ],
        slurm={"nodes": 3, "roles": {"chief": 1, "worker": 1, "evaluator": 1}},
        checkpoint={"dir": str(tmp_path / "ckpt")},
        job={"stop_grace_s": 2},
    )
    run_dir = tmp_path / "run"
    argv = [
        "salloc",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--immediate=30",
        *launch_argv(spec, run_dir, "-q", "--no-gather"),
    ]
    rc, _out, err = finish(start(slurm, argv, cwd=REPO), timeout=240)
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded", res
    assert set(res["tasks"]) == {"chief:0", "worker:0", "evaluator:0"}
    assert res["tasks"]["chief:0"]["state"] == "succeeded"
    ev_log = _log(run_dir, "evaluator-0")
    assert "evaluated the checkpoint of step" in ev_log, ev_log[-2000:]
    # each evaluation the evaluator printed is an `evaluation` event with its step and metrics
    printed = [int(m) for m in re.findall(r"evaluated the checkpoint of step (\d+):", ev_log)]
    evaluations = [e for e in events(run_dir) if e["event"] == "evaluation"]
    assert [e["step"] for e in evaluations] == printed and all(
        {"loss", "mae"} <= set(e["metrics"]) for e in evaluations
    )
    assert res["tasks"]["evaluator:0"]["state"] in ("succeeded", "stopped")  # by itself, or once training ended
    assert not [e for e in events(run_dir) if e["event"] == "role_failure"]
    wait_for(lambda: not slurm.processes(), 15, "every task process to be gone")
