"""The ``Scheduler`` of ``scheduler: slurm`` (see the package)."""

from __future__ import annotations

import os
import shlex

from ...backends import Backend
from ...core.errors import UsageError
from ...core.result import RunResult
from ...job import LaunchOptions
from ...plan import Plan, PlanNotes
from ...runs import RunDir
from ...spec import LoadedSpec
from ...views.handle import RunHandle
from ..base import Scheduler
from .commands import inside_allocation
from .plan import describe, slurm_plan


class SlurmScheduler(Scheduler):
    name = "slurm"

    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan:
        """Inside an allocation the nodes are known: the plan (and what names a host: check's findings,
        a root cause) uses their Slurm names, as the batch job's supervisor does."""
        if inside_allocation():
            from .step import allocation_nodes

            return slurm_plan(loaded.spec, run_id=run_id, node_names=allocation_nodes(os.environ))
        return slurm_plan(loaded.spec, run_id=run_id)

    def plan_notes(self, plan: Plan) -> PlanNotes:
        return PlanNotes(
            started_by=lambda n: f"  started by: slurm ({shlex.join(n.argv)}; config over the connect-back channel)",
            tf_config_note="   (template: the task fills in addresses and ports)",
            extra=describe(plan),
            backup_note="(nothing is copied off the nodes under Slurm: put restart.backup_dir on shared storage)",
        )

    def check(self, opts: LaunchOptions) -> None:
        if opts.bound is not None and opts.bound.active:
            raise UsageError("--max-steps/--max-duration: not under scheduler: slurm yet (use the spec's slurm.time)")
        if opts.tensorboard_dir is not None and not inside_allocation():
            raise UsageError("--tensorboard: a submitted run's supervisor reads the spec; use its tensorboard.dir")

    def supervises_here(self) -> bool:
        return inside_allocation()

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        from .step import SlurmStepBackend

        return SlurmStepBackend(loaded.spec, plan)

    def launch(self, loaded: LoadedSpec, plan: Plan, opts: LaunchOptions) -> RunResult | None:
        """Inside an allocation: supervise it here. From a login node: submit, then follow (or detach)."""
        if inside_allocation():
            from .batch import launch_in_allocation

            return launch_in_allocation(loaded, plan, opts)
        from .launch import submit_and_follow

        return submit_and_follow(loaded, plan, opts)

    def handle(self, run: RunDir) -> RunHandle:
        from .handle import SlurmHandle

        return SlurmHandle(run)


SCHEDULER = SlurmScheduler()
