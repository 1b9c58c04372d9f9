"""The ``Scheduler`` of ``scheduler: ssh`` (see the package)."""

from __future__ import annotations

from typing import Any

from ...backends import Backend
from ...core.errors import UsageError
from ...plan import Plan, PlanNotes
from ...runs import RunDir, plan_or_none
from ...spec import LoadedSpec
from ..base import Scheduler
from .plan import ssh_plan


class SshScheduler(Scheduler):
    name = "ssh"

    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan:
        from .sshconfig import SshConfigError, local_user, ssh_config_lookup

        spec = loaded.spec
        try:
            lookup = ssh_config_lookup(spec.ssh.config_file)
        except SshConfigError as exc:
            raise UsageError(f"ssh.config_file: {exc}") from None
        return ssh_plan(spec, run_id=run_id, local_user=local_user(), ssh_lookup=lookup)

    def plan_notes(self, plan: Plan) -> PlanNotes:
        return PlanNotes(started_by=lambda n: f"  remote:     {n.shell_line()}   (config on stdin)")

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        from ...backends.ssh import SshBackend

        return SshBackend()

    def preflight(self, loaded: LoadedSpec, plan: Plan) -> Any:
        from .preflight import run_preflight

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


SCHEDULER = SshScheduler()
