"""The supervisor of a Slurm run inside an allocation: ``tfcluster slurm-batch RUN`` (the one line of the
batch script tfcluster submits), and ``tfcluster launch`` inside the user's own allocation."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from worker_entry.protocol.env import Env

from ...core.result import RunResult
from ...job import Job, LaunchOptions
from ...plan import Plan
from ...runs import RunDir
from ...spec import LoadedSpec, load_spec, load_spec_text
from . import commands as sc
from .allocation import SlurmScheduling
from .plan import slurm_plan
from .state import SlurmState
from .step import SlurmStepBackend, allocation_nodes


def run_batch(run_dir: str, env: Mapping[str, str] = os.environ) -> RunResult | None:
    """``tfcluster slurm-batch RUN``: the supervisor of one allocation of a submitted run."""
    rundir = RunDir(Path(run_dir))
    state = SlurmState.load(rundir)
    if state is None:
        raise FileNotFoundError(f"{run_dir}: no slurm.json: not a run submitted by tfcluster (or not on a shared filesystem)")
    if rundir.is_finished():
        print(f"tfcluster: run {rundir.path} already finished; nothing to do", flush=True)
        return None
    payload = os.environ.pop(Env.SLURM_SPEC, None) if env is os.environ else env.get(Env.SLURM_SPEC)
    loaded = spec_from_payload(payload) if payload else None
    if loaded is None:  # not submitted by this version: the run directory's (redacted) copy
        print(f"tfcluster: warning: no {Env.SLURM_SPEC} in the job's environment; running RUN/spec.yaml", flush=True)
        loaded = load_spec(rundir.spec_yaml)
    plan = slurm_plan(loaded.spec, run_id=state.run_id, node_names=allocation_nodes(env))
    opts = LaunchOptions(run_dir=str(rundir.path), gather=state.gather, live=False, echo_logs=False)
    scheduling = SlurmScheduling(rundir, state, loaded.spec, batch=True, env=env)
    scheduling.spec_payload = payload
    return Job(loaded, plan, opts, SlurmStepBackend(loaded.spec, plan, env=env), scheduling=scheduling, rundir=rundir).run()


def spec_from_payload(payload: str) -> LoadedSpec | None:
    """The spec ``submit.spec_payload`` packed (validated again, like any spec file); None if garbled."""
    try:
        data = json.loads(base64.b64decode(payload.encode("ascii"), validate=True))
    except (ValueError, UnicodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str) or not isinstance(data.get("path"), str):
        return None
    loaded = load_spec_text(data["text"], data["path"])
    command = data.get("command")
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        job = loaded.spec.job.model_copy(update={"command": command})
        loaded = LoadedSpec(spec=loaded.spec.model_copy(update={"job": job}), path=loaded.path, text=loaded.text,
                            warnings=loaded.warnings)  # fmt: skip
    return loaded


def launch_in_allocation(loaded: LoadedSpec, plan: Plan, opts: LaunchOptions, env: Mapping[str, str] = os.environ) -> RunResult:
    """``tfcluster launch`` with SLURM_JOB_ID set: one srun step per attempt in this allocation."""
    plan = slurm_plan(loaded.spec, run_id=plan.run_id, node_names=allocation_nodes(env))
    rundir = RunDir.create(opts.run_dir or os.path.join("runs", plan.run_id), adopt=opts.adopt_run_dir)
    job_id = sc.job_id_of(env)
    state = SlurmState(run_id=plan.run_id, mode="allocation", job_ids=[job_id] if job_id.isdigit() else [])
    opts = dataclasses.replace(opts, run_dir=str(rundir.path))
    scheduling = SlurmScheduling(rundir, state, loaded.spec, batch=False, env=env)
    return Job(loaded, plan, opts, SlurmStepBackend(loaded.spec, plan, env=env), scheduling=scheduling, rundir=rundir).run()
