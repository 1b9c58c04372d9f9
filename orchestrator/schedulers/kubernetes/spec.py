"""``scheduler: kubernetes`` in the spec: its ``kubernetes:`` section, its rules and where its jobs give roles."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from ...spec.model import Count, GpuCount, Role, SpecModel, matches
from ...spec.sections import Add, RoleHolders, SchedulerSection

#: Kubernetes names: a DNS-1123 label (namespace) or subdomain (service account, secrets, claims).
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: A resource quantity (cpu: 500m, 4; memory: 16Gi, 512M).
QUANTITY_RE = re.compile(r"^[0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
LABEL_KEY_RE = re.compile(
    r"^(?:(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^(?:[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,511}$")


DnsLabel = Annotated[str, Field(strict=True), matches(DNS_LABEL_RE, "a DNS-1123 label (a-z, 0-9, '-', ≤ 63)")]
DnsName = Annotated[str, Field(strict=True), matches(DNS_SUBDOMAIN_RE, "a DNS-1123 name (a-z, 0-9, '-', '.')")]
Quantity = Annotated[str, Field(strict=True), matches(QUANTITY_RE, "a Kubernetes quantity (500m, 4, 16Gi)")]
LabelKey = Annotated[str, Field(strict=True), matches(LABEL_KEY_RE, "a Kubernetes label key")]
LabelValue = Annotated[str, Field(strict=True), matches(LABEL_VALUE_RE, "a Kubernetes label value")]
Image = Annotated[str, Field(strict=True), matches(IMAGE_RE, "a container image reference")]


class ResourcesSpec(SpecModel):
    cpu: Quantity | None = Field(None, description="CPU (500m, 4).")
    memory: Quantity | None = Field(None, description="Memory (16Gi).")


class TolerationSpec(SpecModel):
    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Annotated[int, Field(strict=True, ge=0)] | None = None


#: Where the pods' own volumes are: the PVC mounted there (or over the root) broke the pod, and two
#: mounts at one path Kubernetes refuses at apply time (render --validate passed it)
#: The per-pod emptyDir where worker_entry keeps each task's log and exit status.
POD_DIR = "/tfcluster"
TAKEN_MOUNTS = (POD_DIR, "/dev/shm")


def _mount_path(value: str) -> str:
    parts = value.split("/")
    if ".." in parts or "." in parts:
        raise ValueError(f"{value!r}: a mount path without '.' or '..' components")
    norm = "/" + "/".join(p for p in parts if p)
    if norm == "/" or any(norm == t or norm.startswith(t + "/") for t in TAKEN_MOUNTS):
        raise ValueError(f"{value!r}: not '/', nor {' or '.join(TAKEN_MOUNTS)} (or under them): tfcluster mounts those")
    return value


class VolumeSpec(SpecModel):
    claim_name: DnsName = Field(description="PersistentVolumeClaim that holds checkpoints and the backup.")
    mount_path: Annotated[str, Field(strict=True, pattern=r"^/[^\x00-\x1f]*$"), AfterValidator(_mount_path)] = Field(
        description="Where it is mounted in every pod (an absolute path)."
    )


class KubernetesSpec(SpecModel):
    """Run as a JobSet (or an Indexed Job + headless Service) of pods running worker_entry."""

    namespace: DnsLabel = Field("default", description="Namespace of the job.")
    image: Image = Field(description="Container image with Python, TensorFlow, tf_keras and tfcluster.")
    workers: Count | None = Field(
        None, description="Worker pods (MWMS tasks), besides the chief if tensorflow.chief (or kubernetes.roles)."
    )
    roles: dict[Role, Annotated[int, Field(strict=True, ge=0, le=100_000)]] | None = Field(
        None,
        description="Pods of the job by role (chief, worker, ps, evaluator), e.g. {chief: 1, worker: 4, ps: 2}: "
        "one replicated job per role, instead of workers. Which roles a strategy allows: tensorflow.strategy.",
    )
    gpus_per_worker: GpuCount = Field(0, description="nvidia.com/gpu limit per pod.")
    requests: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Resource requests per pod.")
    limits: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Resource limits per pod.")
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[TolerationSpec] = Field(default_factory=list, description="Pod tolerations.")
    service_account: DnsName | None = Field(None, description="Pod serviceAccountName.")
    image_pull_secrets: list[DnsName] = Field(default_factory=list, description="Secrets to pull the image.")
    env_secret: DnsName | None = Field(
        None,
        description="An existing Secret in the namespace whose keys every pod gets as environment variables "
        "(envFrom): credentials kept out of the spec. Credentials written in job.env or job.command go into a "
        "Secret tfcluster renders itself (<name>-credentials), never into the pods' plain env or args.",
    )
    volume: VolumeSpec | None = Field(None, description="A PVC for checkpoints and backups, mounted in every pod.")
    flavor: Literal["jobset", "indexed-job"] = Field(
        "jobset", description="jobset (needs the JobSet controller) or indexed-job (plain Kubernetes)."
    )
    avoid_unresponsive_nodes: bool = Field(
        False,
        description="flavor indexed-job: when a restart had to force-delete a pod whose node never answered, the "
        "restarted pods get a node affinity that keeps them off that node (false: Kubernetes' own taints decide; "
        "true can leave the pods Pending when no other node fits).",
    )
    network_policy: bool = Field(
        True,
        description="A NetworkPolicy admitting ingress to the job's pods only from the job's own pods (TF's "
        "gRPC server runs any client's ops); false: none (pods reachable as the cluster's policies allow).",
    )


def _rules(data: dict[str, Any], add: Add) -> None:
    """The Secret tfcluster renders is not the user's; workers or roles, not both and not neither."""
    kube, name = data.get("kubernetes"), data.get("name")
    if not isinstance(kube, dict):
        return
    if isinstance(name, str) and kube.get("env_secret") == f"{name}-credentials":
        add(
            ("kubernetes", "env_secret"),
            f"{name}-credentials is the Secret tfcluster renders for job.env's credentials (and deletes with "
            "the job); give your own Secret another name",
        )
    if kube.get("roles") is None and "workers" not in kube:
        add(
            ("kubernetes",),
            "needs kubernetes.workers (the worker pods) or kubernetes.roles "
            "(pods by role, e.g. roles: {chief: 1, worker: 2, ps: 1})",
        )
    if kube.get("roles") is not None and "workers" in kube:
        add(
            ("kubernetes", "workers"),
            "not used with kubernetes.roles (the worker count is roles.worker); remove one of them",
        )


def _roles(data: dict[str, Any]) -> RoleHolders | None:
    section = data.get("kubernetes")
    if not isinstance(section, dict):
        return None
    return RoleHolders(
        holders=[(("kubernetes", "roles"), "kubernetes.roles", section.get("roles"))],
        given=[0] if section.get("roles") is not None else [],
        field="kubernetes.roles",
        example="kubernetes.roles: {chief: 1, worker: 2, ps: 1}",
    )


SECTION = SchedulerSection(
    name="kubernetes",
    key="kubernetes",
    fields={"kubernetes": (KubernetesSpec | None, Field(None, description="scheduler kubernetes: the pods to run."))},
    needs="a kubernetes: section (at least image, and workers or roles)",
    package="orchestrator.schedulers.kubernetes.scheduler",
    rules=_rules,
    roles=_roles,
)
