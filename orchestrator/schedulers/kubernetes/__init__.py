"""``scheduler: kubernetes``: render a plan as a JobSet (or Indexed Jobs + a headless Service), validate it
offline, and run it — apply with the official ``kubernetes`` client, follow every pod's log (the pods'
channel: ``worker_entry.protocol.podlog``), stop by deleting what was applied.

Only ``backend``/``api`` import the ``kubernetes`` client, and only when a launch needs it; planning,
rendering and validating never do.
"""

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
from .render import JOBSET_API, render, to_yaml, with_flavor


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

__all__ = ["JOBSET_API", "SCHEDULER", "KubernetesScheduler", "kubernetes_plan", "render", "to_yaml", "with_flavor"]
