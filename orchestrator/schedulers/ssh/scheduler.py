"""The ``Scheduler`` of ``scheduler: ssh`` (see the package)."""

from __future__ import annotations

from typing import Any

from ...backends import Backend
from ...core.errors import UsageError
from ...job import Members, RunScheduling
from ...plan import Plan, PlanNotes
from ...runs import RunDir, plan_or_none
from ...spec import LoadedSpec
from ..base import Scheduler
from .plan import ssh_plan


class SshScheduler(Scheduler):
    name = "ssh"

    def plan(self, loaded: LoadedSpec, run_id: str, **members: Any) -> Plan:
        """The plan; ``members``: ``ssh_plan``'s (the hosts of a reshaped attempt, the spares left)."""
        from .sshconfig import SshConfigError, local_user, ssh_config_lookup

        spec = loaded.spec
        try:
            lookup = ssh_config_lookup(spec.ssh.config_file)
        except SshConfigError as exc:
            raise UsageError(f"ssh.config_file: {exc}") from None
        return ssh_plan(spec, run_id=run_id, local_user=local_user(), ssh_lookup=lookup, **members)

    def scheduling(self, loaded: LoadedSpec, plan: Plan) -> RunScheduling:
        return SshScheduling(self, loaded)

    def plan_notes(self, plan: Plan) -> PlanNotes:
        return PlanNotes(started_by=lambda n: f"  remote:     {n.shell_line()}   (config on stdin)")

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        from ...backends.ssh import SshBackend

        return SshBackend()

    def preflight(self, loaded: LoadedSpec, plan: Plan) -> Any:
        from .preflight import run_preflight

        if plan.spares:  # a spare is checked like any other host: as the task it would run
            plan = self.plan(loaded, plan.run_id, members=(*dict.fromkeys(plan.members), *plan.spares), spares=())
        return run_preflight(loaded.spec, plan)

    def gather(self, run: RunDir) -> dict[str, Any]:
        from ...spec import load_spec
        from .gather import gather_run

        recorded = plan_or_none(run)
        loaded = load_spec(str(run.spec_yaml))
        return gather_run(run, loaded, self.plan(loaded, recorded.run_id if recorded else run.path.name))

    def check_sweep(self, loaded: LoadedSpec) -> None:
        if not loaded.spec.hosts:
            super().check_sweep(loaded)


class SshScheduling(RunScheduling):
    """The SSH fleet's part of a running job: a plan without a host lost for good (issue 34)."""

    reshapes = True

    def __init__(self, scheduler: SshScheduler, loaded: LoadedSpec) -> None:
        self.scheduler = scheduler
        self.loaded = loaded

    def replan(self, plan: Plan, members: Members) -> Plan | None:
        return self.scheduler.plan(
            self.loaded,
            plan.run_id,
            members=members.hosts,
            spares=members.spares,
            planned_workers=members.planned,
            roles={host: dict(roles) for host, roles in members.roles},
        )


SCHEDULER = SshScheduler()
