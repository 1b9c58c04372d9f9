"""The spec sections of the schedulers that start tasks for us: Slurm and Kubernetes.

``scheduler: ssh`` (the default) uses ``hosts:``; ``scheduler: slurm`` a ``slurm:`` section and
``scheduler: kubernetes`` a ``kubernetes:`` section instead. Which combinations are allowed is a rule
across fields (``rules.py``), reported at the line of the offending key.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

Role = Literal["chief", "worker", "ps", "evaluator"]  # worker_entry.protocol.ROLES

#: Slurm's time formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; or UNLIMITED/INFINITE.
SLURM_TIME_RE = re.compile(r"^(?:\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
#: A Slurm name (partition, account, qos): letters, digits and ._- only.
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: sbatch options tfcluster sets itself (or that have their own field): not allowed in extra_args.
SLURM_RESERVED_OPTIONS = frozenset(
    {
        "nodes",
        "ntasks",
        "ntasks-per-node",
        "gpus",
        "gpus-per-node",
        "gres",
        "signal",
        "requeue",
        "no-requeue",
        "job-name",
        "output",
        "error",
        "input",
        "partition",
        "account",
        "qos",
        "time",
        "constraint",
        "exclusive",
        "wrap",
        "chdir",
        "export",
        "array",
        "dependency",
        "kill-on-bad-exit",
        "comment",
    }
)
SLURM_OPTION_RE = re.compile(r"^--([a-z][a-z0-9-]*)(?:=([^\x00-\x1f\x7f]*))?$")
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


def _matches(pattern: re.Pattern, what: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _slurm_option(value: str) -> str:
    m = SLURM_OPTION_RE.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} is not an sbatch long option (--name or --name=value, no control characters)")
    if m.group(1) in SLURM_RESERVED_OPTIONS:
        raise ValueError(f"--{m.group(1)} is set by tfcluster (or by its own field in slurm:); remove it here")
    return value


def _time_is_text(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f'read as the number {value:g}: quote the time (time: "10:00"); YAML reads unquoted 10:00 as a '
            "base-60 number (600), and Slurm reads a bare number as minutes"
        )
    return value


SlurmName = Annotated[str, Field(strict=True), _matches(SLURM_NAME_RE, "a Slurm name (letters, digits, '._-')")]
SlurmTime = Annotated[
    str,
    BeforeValidator(_time_is_text),
    Field(strict=True),
    _matches(SLURM_TIME_RE, "a Slurm time (minutes, H:M:S, D-H:M:S or UNLIMITED)"),
]
SlurmOption = Annotated[str, Field(strict=True), AfterValidator(_slurm_option)]
DnsLabel = Annotated[str, Field(strict=True), _matches(DNS_LABEL_RE, "a DNS-1123 label (a-z, 0-9, '-', ≤ 63)")]
DnsName = Annotated[str, Field(strict=True), _matches(DNS_SUBDOMAIN_RE, "a DNS-1123 name (a-z, 0-9, '-', '.')")]
Quantity = Annotated[str, Field(strict=True), _matches(QUANTITY_RE, "a Kubernetes quantity (500m, 4, 16Gi)")]
LabelKey = Annotated[str, Field(strict=True), _matches(LABEL_KEY_RE, "a Kubernetes label key")]
LabelValue = Annotated[str, Field(strict=True), _matches(LABEL_VALUE_RE, "a Kubernetes label value")]
Image = Annotated[str, Field(strict=True), _matches(IMAGE_RE, "a container image reference")]
Count = Annotated[int, Field(strict=True, ge=1, le=100_000)]
GpuCount = Annotated[int, Field(strict=True, ge=0, le=1024)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False, defer_build=True)


class SlurmSpec(_Model):
    """Run under Slurm: `sbatch` from a login node, or one `srun` step inside an allocation."""

    nodes: Count = Field(description="Nodes to allocate (sbatch --nodes).")
    tasks_per_node: Count = Field(1, description="MWMS tasks per node (each one worker_entry and one TF server).")
    gpus_per_node: GpuCount = Field(0, description="GPUs per node (--gpus-per-node); split evenly among its tasks.")
    partition: SlurmName | None = Field(None, description="sbatch --partition.")
    account: SlurmName | None = Field(None, description="sbatch --account.")
    qos: SlurmName | None = Field(None, description="sbatch --qos.")
    time: SlurmTime | None = Field(None, description="Time limit (sbatch --time): minutes, H:M:S, D-H:M:S.")
    constraint: (
        Annotated[str, Field(strict=True, min_length=1, max_length=1024, pattern=r"^[^\s\x00-\x1f]+$")] | None
    ) = Field(None, description="sbatch --constraint (node features).")
    exclusive: bool = Field(False, description="sbatch --exclusive: no other job shares the nodes.")
    extra_args: list[SlurmOption] = Field(
        default_factory=list,
        description="More sbatch/srun long options (--mem=64G, --reservation=x); options tfcluster sets are refused.",
    )
    requeue: bool = Field(
        True, description="Requeue the job after a preemption or time limit (resume from the backup)."
    )
    signal_lead_s: Annotated[int, Field(strict=True, ge=0, le=65535)] = Field(
        120,
        description="Seconds before the time limit (or on preemption) that SIGUSR2 asks the job to save (--signal).",
    )
    max_requeues: Annotated[int, Field(strict=True, ge=0, le=1000)] = Field(
        10, description="At most this many requeues after preemptions, and this many after time limits."
    )
    roles: dict[Role, Annotated[int, Field(strict=True, ge=0, le=65536)]] | None = Field(
        None,
        description="Tasks of the job by role (chief, worker, ps, evaluator), e.g. {chief: 1, worker: 6, ps: 1}: "
        "as many as nodes x tasks_per_node, placed in that order (block distribution). Default: tensorflow.chief "
        "and workers. Which roles a strategy allows: tensorflow.strategy.",
    )


class ResourcesSpec(_Model):
    cpu: Quantity | None = Field(None, description="CPU (500m, 4).")
    memory: Quantity | None = Field(None, description="Memory (16Gi).")


class TolerationSpec(_Model):
    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Annotated[int, Field(strict=True, ge=0)] | None = None


class VolumeSpec(_Model):
    claim_name: DnsName = Field(description="PersistentVolumeClaim that holds checkpoints and the backup.")
    mount_path: Annotated[str, Field(strict=True, pattern=r"^/[^\x00-\x1f]*$")] = Field(
        description="Where it is mounted in every pod (an absolute path)."
    )


class KubernetesSpec(_Model):
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
    network_policy: bool = Field(
        True,
        description="A NetworkPolicy admitting ingress to the job's pods only from the job's own pods (TF's "
        "gRPC server runs any client's ops); false: none (pods reachable as the cluster's policies allow).",
    )
