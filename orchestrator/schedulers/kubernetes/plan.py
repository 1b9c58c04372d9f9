"""The plan of a ``scheduler: kubernetes`` spec: one pod per MWMS task, reached by stable DNS names.

Both flavours give every pod a stable hostname under a headless Service (the pod's ``subdomain``):

- ``jobset``: replicated jobs ``worker`` (and ``chief``), each one Indexed Job; the JobSet controller
  names the pods' hostnames ``<jobset>-<replicated job>-<job index>-<pod index>`` under the
  Service ``<jobset>``;
- ``indexed-job``: Jobs ``<name>-worker`` (and ``<name>-chief``) in completion mode Indexed, whose
  pods are ``<job>-<index>`` under the Service ``<name>``.

So TF_CONFIG is known before anything runs, and a pod finds its own entry by its Job's completion
index. With ``kubernetes.roles`` every role (chief, worker, ps, evaluator) is its own replicated job /
Indexed Job, in rank order chief, workers, ps, evaluator; the evaluator is outside TF_CONFIG's cluster
(as TF's docs do) and has no TF server port, a ps gets no GPU. Pure, like the rest of the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.errors import UsageError
from ...plan.build import (
    Placement,
    assign_tasks,
    build_plan,
    plan_warnings,
    resolve_communication,
    role_slots,
)
from ...plan.model import Plan, TaskId
from ...spec import ClusterSpec
from .spec import POD_DIR

#: The pod name's random suffix ("-" + 5 characters), which must still fit a DNS label.
POD_SUFFIX = 6
DNS_LABEL_MAX = 63
DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PodNames:
    """Every Kubernetes name of a job, for one flavour (the renderer and the plan share them)."""

    name: str
    flavor: str

    @property
    def service(self) -> str:
        """The headless Service, and every pod's subdomain."""
        return self.name

    def replicated_job(self, task_type: str) -> str:
        return task_type

    def job_name(self, task_type: str) -> str:
        """The (child) Job whose pods run this task type."""
        if self.flavor == "jobset":
            return f"{self.name}-{task_type}-0"
        return f"{self.name}-{task_type}"

    def hostname(self, task: TaskId) -> str:
        return f"{self.job_name(task.type)}-{task.index}"

    def address(self, task: TaskId) -> str:
        """What the other pods dial: hostname.subdomain (the namespace's search path completes it)."""
        return f"{self.hostname(task)}.{self.service}"


def pod_names(spec: ClusterSpec, flavor: str | None = None) -> PodNames:
    k8s = spec.kubernetes
    assert k8s is not None
    return PodNames(spec.name, flavor or k8s.flavor)


def checkpoint_dirs(spec: ClusterSpec) -> tuple[str, str]:
    """(checkpoint dir, backup dir) in the pods: on the volume when there is one, so restarts resume."""
    k8s = spec.kubernetes
    assert k8s is not None
    base = f"{k8s.volume.mount_path.rstrip('/')}/{spec.name}" if k8s.volume else POD_DIR
    return spec.checkpoint.dir or f"{base}/checkpoints", spec.restart.backup_dir or f"{base}/backup"


def kubernetes_plan(spec: ClusterSpec, *, run_id: str) -> Plan:
    k8s = spec.kubernetes
    if k8s is None:
        raise UsageError("scheduler: kubernetes needs a kubernetes: section")
    names = pod_names(spec)
    tasks = job_tasks(spec)
    _check_name_lengths(names, tasks)
    port = spec.tensorflow.port
    checkpoint_dir, backup_dir = checkpoint_dirs(spec)
    placements = [
        Placement(
            task=task,
            host=names.address(task),
            tf_address=names.address(task),
            tf_port=0 if task.type == "evaluator" else port,  # an evaluator runs no TF server
            gpus=gpus_of(spec, task.type),
            endpoint=f"{names.address(task)}:{port}",
        )
        for task in tasks
    ]
    return build_plan(
        spec,
        run_id,
        placements,
        entry=("kubernetes",),
        task_root=POD_DIR,
        dirs=(checkpoint_dir, backup_dir),
        communication=resolve_communication(spec.tensorflow.communication, k8s.gpus_per_worker),
        warnings=plan_warnings(spec, k8s.gpus_per_worker) + kubernetes_warnings(spec, checkpoint_dir, backup_dir),
    )


def job_tasks(spec: ClusterSpec) -> list[TaskId]:
    """Every task in rank order: by ``kubernetes.roles`` (chief, workers, ps, evaluator), else
    ``tensorflow.chief`` and ``kubernetes.workers``."""
    k8s = spec.kubernetes
    assert k8s is not None
    if k8s.roles:
        return [task for _, task, _ in role_slots([dict(k8s.roles)])]
    if k8s.workers is None:
        raise UsageError("kubernetes: set kubernetes.workers or kubernetes.roles")
    return assign_tasks(k8s.workers + (1 if spec.tensorflow.chief else 0), spec.tensorflow.chief)


def gpus_of(spec: ClusterSpec, task_type: str) -> int:
    """``gpus_per_worker`` for the tasks that compute (chief, worker, evaluator); a ps only holds variables."""
    k8s = spec.kubernetes
    assert k8s is not None
    return 0 if task_type == "ps" else k8s.gpus_per_worker


def kubernetes_warnings(spec: ClusterSpec, checkpoint_dir: str, backup_dir: str) -> list[str]:
    k8s = spec.kubernetes
    assert k8s is not None
    out = []
    if k8s.volume is None:
        out.append(
            "kubernetes.volume is not set: checkpoints and the BackupAndRestore directory live in each pod's "
            "emptyDir and are lost when the pods restart (set a ReadWriteMany PersistentVolumeClaim to resume)"
        )
    else:
        mount = k8s.volume.mount_path.rstrip("/") + "/"
        for what, path in (("checkpoint.dir", checkpoint_dir), ("restart.backup_dir", backup_dir)):
            if not path.startswith(mount):
                out.append(f"{what} {path} is not under kubernetes.volume.mount_path {mount}: it is lost with the pod")
    if k8s.flavor == "indexed-job" and spec.tensorflow.strategy == "parameter_server":
        out.append(
            "flavor indexed-job: the worker and ps Jobs never complete by themselves; `tfcluster launch` stops "
            "them when the chief is done, a manifest applied with kubectl leaves them running (use flavor: jobset, "
            "whose successPolicy ends the JobSet with the chief)"
        )
    if k8s.flavor == "indexed-job" and spec.restart.max_restarts:
        out.append(
            "flavor indexed-job: Kubernetes itself does not restart a failed Indexed Job (backoffLimit 0); "
            "`tfcluster launch` restarts it, a manifest applied with kubectl does not (use flavor: jobset)"
        )
    return out


def _check_name_lengths(names: PodNames, tasks: list[TaskId]) -> None:
    """The name becomes a Service (a DNS-1035 label: starts with a letter, ends with a letter or digit);
    pod names are ``<hostname>-xxxxx`` and hostnames DNS labels: both must fit 63 characters."""
    if not DNS_1035_RE.fullmatch(names.name):
        raise UsageError(
            f"name {names.name!r} cannot name a Kubernetes Service: start it with a letter and end it with a "
            "letter or digit"
        )
    longest = max((names.hostname(t) for t in tasks), key=len)
    if len(longest) + POD_SUFFIX > DNS_LABEL_MAX:
        room = len(names.name) - (len(longest) + POD_SUFFIX - DNS_LABEL_MAX)
        raise UsageError(
            f"name {names.name!r} is too long for Kubernetes with flavor {names.flavor}: pod {longest}-xxxxx "
            f"would exceed {DNS_LABEL_MAX} characters; use a name of at most {max(room, 1)} characters"
        )
