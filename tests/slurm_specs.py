"""The Slurm spec the unit tiers start from (2 nodes x 2 tasks), its rule errors, and a Slurm ``Job`` of
it with no backend (the allocation's decisions without starting anything)."""

from __future__ import annotations

import textwrap

from orchestrator.runs import RunDir
from orchestrator.schedulers.slurm.plan import slurm_plan
from orchestrator.spec import check_spec_text

SPEC = """\
version: 1
name: sl
scheduler: slurm
slurm:
  nodes: 2
  tasks_per_node: 2
{extra_slurm}job:
  command: [python, train.py]
{extra}"""


def spec_text(extra_slurm: str = "", extra: str = "") -> str:
    return SPEC.format(extra_slurm=textwrap.indent(textwrap.dedent(extra_slurm), "  "), extra=extra)


def errors(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(text, "s.yaml") if p.severity == "error"]


class NoBackend:
    """A backend that starts nothing: the tests drive the job's scheduling decisions only."""

    notes: list[str] = []
    transfers = True
    fds_per_task = 3  # what the job's open-file check reads (Backend's default)

    def bind_run(self, run_dir) -> None:
        pass

    def close(self) -> None:
        pass


def slurm_job(tmp_path, loaded, state, *, batch, env):
    from orchestrator.job import Job, LaunchOptions
    from orchestrator.schedulers.slurm.allocation import SlurmScheduling

    plan = slurm_plan(loaded.spec, run_id="sl-1")
    run = RunDir.create(tmp_path / "run")
    scheduling = SlurmScheduling(run, state, loaded.spec, batch=batch, env=env)
    job = Job(loaded, plan, LaunchOptions(live=False, echo_logs=False), NoBackend(), scheduling=scheduling, rundir=run)
    return job, run, scheduling
