"""The supervisor of a Slurm run inside an allocation: ``tfcluster slurm-batch RUN`` (the one line of the
batch script tfcluster submits), and ``tfcluster launch`` inside the user's own allocation."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from ...core.result import RunResult
from ...job import Job, LaunchOptions
from ...plan import Plan
from ...runs import RunDir, plan_or_none
from ...spec import LoadedSpec
from . import commands as sc
from .allocation import SlurmScheduling
from .plan import slurm_plan
from .private_spec import PrivateSpecMissing, read_private_spec, remove_private_spec
from .state import SlurmState
from .step import SlurmStepBackend, allocation_nodes
from .submit import record_not_run


def run_batch(run_dir: str, env: Mapping[str, str] = os.environ) -> RunResult | None:
    """``tfcluster slurm-batch RUN``: the supervisor of one allocation of a submitted run. Without the
    private spec it refuses (result.json says why) rather than run the redacted copy's ``<redacted>``."""
    rundir = RunDir(Path(run_dir))
    state = SlurmState.load(rundir)
    if state is None:
        raise FileNotFoundError(
            f"{run_dir}: no slurm.json: not a run submitted by tfcluster (or not on a shared filesystem)"
        )
    if rundir.is_finished():
        print(f"tfcluster: run {rundir.path} already finished; nothing to do", flush=True)
        remove_private_spec(rundir)
        return None
    try:
        loaded = read_private_spec(rundir)
    except PrivateSpecMissing as exc:
        print(f"tfcluster: error: {exc}", flush=True)
        return _refuse(rundir, state, str(exc))
    plan = slurm_plan(loaded.spec, run_id=state.run_id, node_names=allocation_nodes(env))
    opts = LaunchOptions(run_dir=str(rundir.path), gather=state.gather, live=False, echo_logs=False)
    scheduling = SlurmScheduling(rundir, state, loaded.spec, batch=True, env=env)
    try:
        return Job(
            loaded, plan, opts, SlurmStepBackend(loaded.spec, plan, env=env), scheduling=scheduling, rundir=rundir
        ).run()
    finally:
        if rundir.is_finished():  # the run is over (not handed to a next allocation)
            remove_private_spec(rundir)


def _refuse(rundir: RunDir, state: SlurmState, message: str) -> RunResult:
    """The batch job cannot run its spec: record it as a start failure, with the planned job's names."""
    plan = plan_or_none(rundir)
    hint = "the batch job runs RUN/slurm/private-spec.json, written by `tfcluster launch` on the login node"
    return record_not_run(
        rundir, plan.job if plan else "", state.run_id, len(plan.tasks) if plan else 0, 1, message, hint
    )


def launch_in_allocation(
    loaded: LoadedSpec, plan: Plan, opts: LaunchOptions, env: Mapping[str, str] = os.environ
) -> RunResult:
    """``tfcluster launch`` with SLURM_JOB_ID set: one srun step per attempt in this allocation."""
    plan = slurm_plan(loaded.spec, run_id=plan.run_id, node_names=allocation_nodes(env))
    rundir = RunDir.create(opts.run_dir or os.path.join("runs", plan.run_id), adopt=opts.adopt_run_dir)
    job_id = sc.job_id_of(env)
    state = SlurmState(run_id=plan.run_id, mode="allocation", job_ids=[job_id] if job_id.isdigit() else [])
    opts = dataclasses.replace(opts, run_dir=str(rundir.path))
    scheduling = SlurmScheduling(rundir, state, loaded.spec, batch=False, env=env)
    return Job(
        loaded, plan, opts, SlurmStepBackend(loaded.spec, plan, env=env), scheduling=scheduling, rundir=rundir
    ).run()
