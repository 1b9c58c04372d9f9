"""Which backend runs a plan: the one place that maps ``spec.scheduler`` to a Backend."""

from __future__ import annotations

from ..backends import Backend
from ..core.errors import UsageError
from ..plan import Plan
from ..spec import ClusterSpec


def backend_for(spec: ClusterSpec, plan: Plan) -> Backend:
    if plan.scheduler == "ssh":
        from ..backends.ssh import SshBackend

        return SshBackend()
    if plan.scheduler == "slurm":
        from ..backends.slurm import SlurmStepBackend

        return SlurmStepBackend(spec, plan)
    if plan.scheduler == "kubernetes":
        from ..backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(spec, plan)
    raise UsageError(f"scheduler: {plan.scheduler} cannot be launched by this version of tfcluster")
