"""tfcluster on a real Slurm (slurmctld + three slurmd on this machine) with real TensorFlow.

From the "login node" (this shell, no SLURM_JOB_ID): `launch` submits a batch job whose supervisor
runs in the allocation and follows it; inside an allocation (salloc): `launch` runs one srun step.
Faults: a task SIGKILLed, `stop`, a pending job cancelled, sbatch refusing.
"""

from __future__ import annotations

import json
import os

import pytest
from slurm_fixtures import PY, cli, events, finish, launch_argv, result, start, write_spec

pytestmark = pytest.mark.e2e

MWMS = ["tests/workloads/mwms_job.py"]


def mwms(*args: str) -> list[str]:
    """The MWMS workload, after printing the TF_CONFIG the task built (`TF_CONFIG {...}`)."""
    return ["sh", "-c", 'echo "TF_CONFIG $TF_CONFIG"; exec "$0" "$@"', PY, *MWMS, *args]


def test_mwms_submitted_from_the_login_node(slurm, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", "sl-login", mwms("--epochs", "2", "--steps", "10"))
    run_dir = tmp_path / "run"
    rc, out, err = finish(start(slurm, launch_argv(spec, run_dir), cwd=_repo()), timeout=150)
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded"
    hosts = {t: v["host"] for t, v in res["tasks"].items()}
    assert hosts == {"worker:0": "n1", "worker:1": "n2", "worker:2": "n3"}
    for i in range(3):
        assert f"worker:{i}: done" in out  # live, prefixed, on the login node's stdout
        assert f"[worker:{i} n{i + 1}] worker:{i}: strategy ready with 3 replicas" in out
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds[0] == "job_started" and "slurm_allocation" in kinds and kinds[-1] == "job_finished"
    st = cli(slurm, _repo(), "status", str(run_dir), "--json")
    status = json.loads(st.stdout)
    assert status["state"] == "succeeded" and status["slurm"]["state"] == "COMPLETED"
    assert status["slurm"]["job_ids"] == [json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"]]
    assert cli(slurm, _repo(), "report", str(run_dir)).returncode == 0
    logs = cli(slurm, _repo(), "logs", str(run_dir), "--task", "worker:2", "--raw").stdout
    assert "worker:2: done" in logs and "worker:0:" not in logs
    assert oct(os.stat(run_dir).st_mode & 0o777) == "0o700"
    for name in ("slurm/job.sh", "slurm/sbatch.json", "slurm.json", "spec.yaml"):
        assert os.stat(run_dir / name).st_mode & 0o077 == 0, name
    assert "TFCLUSTER_SECRET" not in (run_dir / "slurm" / "job.sh").read_text()


def test_mwms_inside_an_allocation_with_tasks_sharing_a_node(slurm, tmp_path):
    """salloc: `launch` sees SLURM_JOB_ID and runs one srun step; 3 tasks on one node, a chief."""
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-alloc",
        mwms("--epochs", "2", "--steps", "10"),
        slurm={"nodes": 1, "tasks_per_node": 3},
        tensorflow={"chief": True},
    )
    run_dir = tmp_path / "run"
    argv = ["salloc", "--nodes=1", "--ntasks-per-node=3", "--immediate=30", *launch_argv(spec, run_dir)]
    rc, out, err = finish(start(slurm, argv, cwd=_repo()), timeout=150)
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded"
    assert set(res["tasks"]) == {"chief:0", "worker:0", "worker:1"}
    assert {v["host"] for v in res["tasks"].values()} == {"n1"}
    assert "chief:0: done" in out
    # the three TF servers shared one address and got three ports
    configs = _tf_configs(run_dir)
    assert len(configs) == 3
    eps = configs[0]["cluster"]["chief"] + configs[0]["cluster"]["worker"]
    assert len(set(eps)) == 3 and all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert (run_dir / "slurm.json").exists() and json.loads((run_dir / "slurm.json").read_text())["mode"] == "allocation"


def _tf_configs(run_dir):
    """TF_CONFIG as each task saw it (printed by the command before the workload starts)."""
    text = (run_dir / "combined.log").read_text()
    return [json.loads(line.split("] TF_CONFIG ", 1)[1]) for line in text.splitlines() if "] TF_CONFIG " in line]


def _repo():
    from slurm_fixtures import REPO

    return REPO
