"""Stage 10: the schedulers. One package each, holding everything that differs per scheduler: its spec
section and rules (``SECTION``, registered with the spec: ``spec.sections``), its planner, backend,
what it adds to a running job, its run handle, its own commands (``COMMANDS``) — behind one
``Scheduler`` object (``base``). This registry maps a spec's ``scheduler:`` (or a run's plan record) to
it and names none: the packages are found under this one (``spec.sections.PLUGINS``), and a scheduler
from elsewhere is registered with ``spec.sections.register``. Each loads its launch code only when used
(the Kubernetes client, say, is imported by a Kubernetes launch alone).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..core.errors import UsageError

if TYPE_CHECKING:
    from ..plan import Plan
    from ..runs import RunDir
    from ..spec import ClusterSpec, LoadedSpec
    from .base import Scheduler
    from .command import SchedulerCommand


def scheduler_named(name: str) -> Scheduler:
    from ..spec.sections import section_named, sections

    section = section_named(name)
    if section is None:
        raise UsageError(f"scheduler: {name} is not supported by this version of tfcluster ({', '.join(sections())})")
    scheduler: Scheduler = importlib.import_module(section.package).SCHEDULER
    return scheduler


def scheduler_for(spec: ClusterSpec) -> Scheduler:
    return scheduler_named(spec.scheduler)


def scheduler_of(run: RunDir) -> Scheduler:
    """The scheduler of a run directory (its plan record; runs of versions before schedulers were recorded,
    and a damaged plan.json: the default one)."""
    from ..runs import plan_or_none
    from ..spec.sections import default_scheduler

    plan = plan_or_none(run)
    try:
        return scheduler_named(plan.scheduler if plan else default_scheduler())
    except UsageError as exc:  # a plan.json naming a scheduler this version lacks (newer, or damaged)
        raise UsageError(f"{run.path}/plan.json: {exc}") from None  # (named, not read here)


def plan_spec(loaded: LoadedSpec, run_id: str | None = None) -> Plan:
    """The plan of a validated spec, by its scheduler's planner."""
    from ..plan import default_run_id

    return scheduler_for(loaded.spec).plan(loaded, run_id or default_run_id(loaded.spec.name))


def load_plan(spec_path: str, run_id: str | None = None, command: list[str] | None = None) -> tuple[LoadedSpec, Plan]:
    """Validate the spec (``command`` overrides job.command) and plan it as ``launch`` would."""
    from ..plan import with_command
    from ..plan.load import check_run_id
    from ..spec import load_spec

    if run_id is not None:
        check_run_id(run_id)
    loaded = with_command(load_spec(spec_path), command)
    return loaded, plan_spec(loaded, run_id)


def scheduler_commands() -> list[SchedulerCommand]:
    """Every registered scheduler's own commands (``tfcluster render``, ...), for the CLI to offer."""
    from ..spec.sections import sections

    out: list[SchedulerCommand] = []
    for section in sections().values():
        package = importlib.import_module(section.package.rpartition(".")[0] or section.package)
        out.extend(getattr(package, "COMMANDS", ()))
    return out


def __getattr__(name: str) -> Any:
    if name == "Scheduler":  # the base class, loaded when asked for (it imports the job and the backends)
        from .base import Scheduler

        return Scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Scheduler",
    "load_plan",
    "plan_spec",
    "scheduler_commands",
    "scheduler_for",
    "scheduler_named",
    "scheduler_of",
]
