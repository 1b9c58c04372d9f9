"""Stage 10: the schedulers. One package each (``ssh``, ``slurm``, ``kubernetes``) holding everything
that differs per scheduler — its planner, backend, what it adds to a running job, its run handle and
its own commands — behind one ``Scheduler`` object (``base``). This registry is the one place that
maps a spec's ``scheduler:`` (or a run's plan.json) to it; packages load only when used (the
Kubernetes client, say, is imported by a Kubernetes launch alone).
"""

from __future__ import annotations

import importlib

from ..core.errors import UsageError
from ..plan import Plan, default_run_id, with_command
from ..runs import RunDir, plan_or_none
from ..spec import ClusterSpec, LoadedSpec, load_spec
from .base import Scheduler

#: spec ``scheduler:`` value -> the package whose ``SCHEDULER`` serves it.
PACKAGES = {
    "ssh": "orchestrator.schedulers.ssh",
    "slurm": "orchestrator.schedulers.slurm",
    "kubernetes": "orchestrator.schedulers.kubernetes",
}


def scheduler_named(name: str) -> Scheduler:
    module = PACKAGES.get(name)
    if module is None:
        raise UsageError(f"scheduler: {name} is not supported by this version of tfcluster ({', '.join(PACKAGES)})")
    scheduler: Scheduler = importlib.import_module(module).SCHEDULER
    return scheduler


def scheduler_for(spec: ClusterSpec) -> Scheduler:
    return scheduler_named(spec.scheduler)


def scheduler_of(run: RunDir) -> Scheduler:
    """The scheduler of a run directory (its plan record; runs of versions before schedulers were recorded,
    and a damaged plan.json: ssh)."""
    plan = plan_or_none(run)
    return scheduler_named(plan.scheduler if plan else "ssh")


def plan_spec(loaded: LoadedSpec, run_id: str | None = None) -> Plan:
    """The plan of a validated spec, by its scheduler's planner."""
    return scheduler_for(loaded.spec).plan(loaded, run_id or default_run_id(loaded.spec.name))


def load_plan(spec_path: str, run_id: str | None = None, command: list[str] | None = None) -> tuple[LoadedSpec, Plan]:
    """Validate the spec (``command`` overrides job.command) and plan it as ``launch`` would."""
    loaded = with_command(load_spec(spec_path), command)
    return loaded, plan_spec(loaded, run_id)


__all__ = ["PACKAGES", "Scheduler", "load_plan", "plan_spec", "scheduler_for", "scheduler_named", "scheduler_of"]
