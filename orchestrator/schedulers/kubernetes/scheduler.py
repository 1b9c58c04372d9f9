"""The ``Scheduler`` of ``scheduler: kubernetes`` (see the package)."""

from __future__ import annotations

import shlex
from typing import Any

from ...backends import Backend
from ...core.errors import UsageError
from ...plan import Plan, PlanNotes
from ...runs import RunDir
from ...spec import LoadedSpec
from ...views.handle import RunHandle
from ..base import Scheduler
from .handle import KubernetesHandle
from .plan import kubernetes_plan


class KubernetesScheduler(Scheduler):
    name = "kubernetes"

    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan:
        return kubernetes_plan(loaded.spec, run_id=run_id)

    def plan_notes(self, plan: Plan) -> PlanNotes:
        return PlanNotes(
            started_by=lambda n: (
                f"  pod runs:   {shlex.join(n.argv)} -- COMMAND   (settings in the pod spec: tfcluster render)"
            ),
            workdir_default="the image WORKDIR",
            backup_note="(on the pods' volume: nothing is copied; a ReadWriteMany volume outlives any node)",
        )

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend:
        from .backend import KubernetesBackend

        return KubernetesBackend(loaded.spec, plan)

    def handle(self, run: RunDir) -> RunHandle:
        return KubernetesHandle(run)

    def gather(self, run: RunDir) -> dict[str, Any]:
        raise UsageError(
            "nothing to gather on Kubernetes: every pod's log came through the API into the run directory, "
            "and checkpoints are on kubernetes.volume"
        )


SCHEDULER = KubernetesScheduler()
