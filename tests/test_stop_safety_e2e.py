"""`tfcluster stop` acts only on what belongs to the run: on a real local Slurm, a run directory whose
slurm.json names a Slurm job that is not the run's (another job, a job of the same name, a job of
another user) does not get that job cancelled — slurm.json is a file its owner controls, and `stop`
may run as root. (The Kubernetes side of the same rule is in test_k8s_launch.py.)"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from slurm_fixtures import cli

pytestmark = pytest.mark.e2e


def _bystander(slurm, name: str, comment: str | None = None) -> str:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", "--wrap", "sleep 300"]
    if comment:
        argv.insert(3, f"--comment={comment}")
    return slurm.run(argv).stdout.strip().split(";")[0]


def _state(slurm, job: str) -> str:
    return slurm.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def _forged_run(base: Path, job: str, *, name: str = "forged", run_id: str = "forged-1") -> Path:
    run = base / "run"
    (run / "slurm").mkdir(parents=True, mode=0o700)
    (run / "plan.json").write_text(json.dumps({"job": name, "run_id": run_id, "scheduler": "slurm", "nodes": []}))
    (run / "slurm.json").write_text(json.dumps({"run_id": run_id, "mode": "batch", "job_ids": [job]}))
    return run


@pytest.fixture
def world_dir():
    d = Path(tempfile.mkdtemp(prefix="tfc-stop-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@pytest.mark.parametrize(
    ("job_name", "comment", "why"),
    [
        ("victim", None, "its comment is '', not 'tfcluster:forged-1'"),
        ("other-job", "tfcluster:forged-1", "its name is 'other-job', not the run's job 'forged'"),
    ],
    ids=["unrelated-job", "same-comment-other-name"],
)
def test_stop_does_not_scancel_a_job_that_is_not_the_runs(slurm, world_dir, job_name, comment, why):
    job = _bystander(slurm, job_name, comment)
    try:
        run = _forged_run(world_dir, job)
        r = cli(slurm, world_dir, "stop", str(run), "--timeout", "5")
        assert r.returncode == 2 and f"refusing to scancel Slurm job {job}: {why}" in r.stderr, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and not (run / "slurm" / "stop.json").exists()
        assert _state(slurm, job) in ("RUNNING", "PENDING")  # still there after the stop returned
    finally:
        slurm.run(["scancel", job], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a run directory owned by another user")
def test_stop_as_root_does_not_scancel_roots_job_named_in_another_users_run(slurm, world_dir):
    """Everything matches except the owner: the run directory is nobody's, the job root's."""
    job = _bystander(slurm, "forged", "tfcluster:forged-1")
    try:
        run = _forged_run(world_dir, job)
        for p in [run, *run.rglob("*")]:
            os.chown(p, 65534, 65534)
        r = cli(slurm, world_dir, "stop", str(run), "--timeout", "5")
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"refusing to scancel Slurm job {job}: it belongs to uid 0, the run directory to uid 65534" in r.stderr
        assert _state(slurm, job) in ("RUNNING", "PENDING")
    finally:
        slurm.run(["scancel", job], check=False)
