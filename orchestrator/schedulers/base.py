"""One object per scheduler: everything that differs between the SSH fleet, Slurm and Kubernetes.

How a spec is planned (and shown), which backend starts its tasks and what the running job adds
(``job.RunScheduling``), where a launch's supervisor runs, what a run leaves behind and how to reach
it afterwards (its ``views.RunHandle``), and which commands apply (``preflight``, ``gather``,
``scale``). The CLI, the job and the views call a ``Scheduler`` and never compare scheduler names; a
fourth scheduler is one more package here and one line in the registry (``schedulers/__init__.py``).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from ..backends import Backend
from ..core.errors import UsageError
from ..core.result import RunResult
from ..job import LaunchOptions, launch
from ..job.scheduling import RunScheduling
from ..plan import NodePlan, Plan, PlanNotes, plan_text
from ..plan.render import task_text
from ..runs import RunDir
from ..spec import LoadedSpec
from ..views.handle import RunHandle


class Scheduler(abc.ABC):
    name: ClassVar[str]

    # --- the plan --------------------------------------------------------------------------------

    @abc.abstractmethod
    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan:
        """The plan of a validated spec. Pure (reads ~/.ssh/config at most): ``plan`` shows what
        ``launch`` runs."""

    @abc.abstractmethod
    def plan_notes(self, plan: Plan) -> PlanNotes:
        """What ``tfcluster plan`` says about how this scheduler starts each task."""

    def describe(self, plan: Plan, *, show_secrets: bool = False, every_task: bool = False) -> str:
        """``tfcluster plan``'s text: what every task shares, the table of tasks, how they start."""
        return plan_text(plan, self.plan_notes(plan), show_secrets=show_secrets, every_task=every_task)

    def describe_task(self, plan: Plan, node: NodePlan, *, show_secrets: bool = False) -> str:
        """``tfcluster plan --task``: one task in full (its TF_CONFIG and environment)."""
        return task_text(plan, node, self.plan_notes(plan), show_secrets=show_secrets)

    # --- a launch --------------------------------------------------------------------------------

    def check(self, opts: LaunchOptions) -> None:
        """Refuse, before anything starts, options this scheduler cannot honour (a UsageError)."""
        return None

    def supervises_here(self) -> bool:
        """The run's supervisor is this process (``launch --detach`` puts it in the background); False
        where the scheduler runs it elsewhere (a Slurm batch job submitted from a login node)."""
        return True

    @abc.abstractmethod
    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        """How the plan's tasks are started and reached."""

    def scheduling(self, loaded: LoadedSpec, plan: Plan) -> RunScheduling:
        """What this scheduler adds to a running job (default: nothing; the spec's restart policy)."""
        return RunScheduling()

    def launch(self, loaded: LoadedSpec, plan: Plan, opts: LaunchOptions) -> RunResult | None:
        """Run the job to its end and return its result; None when the job was left to the scheduler
        (submitted with ``--detach``: it runs without us, and the run directory tells everything)."""
        return launch(loaded, plan, opts, self.backend(loaded, plan), self.scheduling(loaded, plan))

    # --- after (or beside) a run -----------------------------------------------------------------

    def handle(self, run: RunDir) -> RunHandle:
        """The run seen from outside its supervisor: alive, the scheduler's view, stop."""
        return RunHandle(run)

    # --- commands only some schedulers have -------------------------------------------------------

    def preflight(self, loaded: LoadedSpec, plan: Plan) -> Any:
        """``tfcluster preflight``: check every host before a launch (a report with ``ok``)."""
        raise UsageError(
            f"preflight connects over SSH; under scheduler: {self.name} the same checks run inside the job "
            "before the go (a failed check stops it before TensorFlow starts: exit code 4)"
        )

    def gather(self, run: RunDir) -> dict[str, Any]:
        """``tfcluster gather RUN``: finish (or redo) a run's gather later."""
        raise UsageError(
            f"gather reconnects over SSH; under scheduler: {self.name} logs and the chief's checkpoint came back "
            "over the tasks' own channels when the job ended (RUN/logs, RUN/checkpoints); what a lost task did "
            "not send stays in its node's task directory (job.remote_dir)"
        )

    def check_sweep(self, loaded: LoadedSpec) -> None:
        """``tfcluster scale`` cuts the spec's hosts to each size: refuse where that means nothing."""
        raise UsageError(
            f"{loaded.path}: scheduler: {self.name}: `tfcluster scale` runs over ssh (hosts:) today; "
            "under Slurm, launch each size with its own slurm.nodes"
        )
