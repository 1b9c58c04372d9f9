"""The cluster spec (version 1): pydantic models, frozen, unknown keys rejected.

Field names are a public contract (other tools write these files). Every field has a description
because `tfcluster schema` hands them to editors.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from .logs import LogsSpec

JOB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SCOPE_ID_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$")
HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
#: Variables tfcluster sets itself; a user value would silently break the cluster.
RESERVED_ENV_PREFIXES = ("TFCLUSTER_",)
RESERVED_ENV_NAMES = frozenset({"TF_CONFIG"})


def _check_port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"must be a TCP port between 1 and 65535, got {value}")
    return value


def _check_address(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError("must be an IP address or hostname without surrounding spaces")
    if value.startswith("-"):
        raise ValueError("must not start with '-' (it would read as an option)")
    _no_control_chars(value)
    try:
        ip = ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        ip = None
    if ip is not None:
        scope = getattr(ip, "scope_id", None)
        if scope is not None and not SCOPE_ID_RE.fullmatch(scope):
            raise ValueError(
                f"IPv6 scope id {scope!r} must be an interface name or number (letters, digits, '._-', "
                "not starting with '-'): it ends up in SSH commands"
            )
        return value.strip("[]")
    if not HOSTNAME_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is neither an IP address nor a valid hostname "
            "(letters, digits, '-', '_' and dots; labels up to 63 characters)"
        )
    return value


def _check_env_name(name: str) -> str:
    if not ENV_NAME_RE.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(f"{name} is set by tfcluster from the spec; remove it from job.env")
    return name


def _scalar_to_str(value: Any) -> Any:
    """YAML reads `--epochs, 3` and `NCCL_IB_DISABLE: 1` as numbers; accept them as their text.

    Booleans are refused instead: `yes`/`on`/`no` silently become true/false in YAML 1.1, so the
    user has to quote them to say what they mean.
    """
    if isinstance(value, bool):
        raise ValueError(f"YAML read this as the boolean {str(value).lower()}; quote it to pass a string")
    if isinstance(value, int | float):
        return str(value)
    return value


def _control_chars(value: str, allowed: str = "") -> str | None:
    """The first control character in ``value`` that is not ``allowed``, if any."""
    for ch in value:
        if (ch < " " or "\x7f" <= ch <= "\x9f") and ch not in allowed:
            return ch
    return None


def _no_control_chars(value: str, allowed: str = "") -> str:
    bad = _control_chars(value, allowed)
    if bad is not None:
        raise ValueError(f"must not contain control characters (found {bad!r} at position {value.index(bad)})")
    return value


def _arg(value: str) -> str:
    """A command argument: tabs and newlines are fine (python -c scripts), other control characters
    (NUL above all: no process argument can hold one) are not."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters (a process argument cannot hold one)")
    return _no_control_chars(value, "\t\n")


def _env_value(value: str) -> str:
    return _no_control_chars(value, "\t")


def _python(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-': it would be read as an option, not an interpreter")
    return value


StrictInt = Annotated[int, Field(strict=True)]
Port = Annotated[int, Field(strict=True), AfterValidator(_check_port)]
#: Seconds and rates: finite, and at most ~31 years (``.inf`` passed validate, then crashed a render; 1e30
#: rendered an integer past int64)
FLOAT_MAX = 1e9
PosFloat = Annotated[float, Field(gt=0, le=FLOAT_MAX, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=FLOAT_MAX, allow_inf_nan=False)]
NonEmptyStr = Annotated[str, Field(min_length=1, max_length=4096, strict=True), AfterValidator(_no_control_chars)]
ArgStr = Annotated[str, BeforeValidator(_scalar_to_str), Field(strict=True, max_length=1 << 20), AfterValidator(_arg)]
EnvValue = Annotated[
    str, BeforeValidator(_scalar_to_str), Field(strict=True, max_length=1 << 20), AfterValidator(_env_value)
]
Interpreter = Annotated[
    str, Field(min_length=1, max_length=4096, strict=True), AfterValidator(_no_control_chars), AfterValidator(_python)
]
EnvName = Annotated[str, Field(strict=True), AfterValidator(_check_env_name)]
Address = Annotated[str, Field(strict=True), AfterValidator(_check_address)]


Role = Literal["chief", "worker", "ps", "evaluator"]  # worker_entry.protocol.ROLES
Count = Annotated[int, Field(strict=True, ge=1, le=100_000)]
GpuCount = Annotated[int, Field(strict=True, ge=0, le=1024)]


def matches(pattern: re.Pattern, what: str) -> AfterValidator:
    """A validator: the value must match ``pattern`` (a ValueError saying it is not ``what`` otherwise)."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


#: A login name reaches ssh's command line through a ProxyCommand's %r: never one that starts with '-'
#: (an option: "-oProxyCommand=..." ran a command) or holds a space or a shell character.
LOGIN_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?")
LoginName = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=64),
    AfterValidator(_no_control_chars),
    matches(LOGIN_RE, "a login name (letters, digits, '_', '.', '@', '-'; not '-' first)"),
]


class SpecModel(BaseModel):
    """A part of the spec: frozen, unknown keys refused (a scheduler's section is one too)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False, defer_build=True)


_Model = SpecModel


class TensorflowSpec(_Model):
    strategy: Literal["multi_worker_mirrored", "parameter_server"] = Field(
        "multi_worker_mirrored",
        description="multi_worker_mirrored: chief (optional) and workers, an optional sidecar evaluator; "
        "parameter_server: one chief (the coordinator), workers, ps tasks and an optional evaluator. Roles are "
        "given by hosts[].roles, slurm.roles or kubernetes.roles.",
    )
    port: Port = Field(12345, description="gRPC port of every task (hosts[].tf_port overrides).")
    communication: Literal["auto", "nccl", "ring"] = Field(
        "auto", description="Collective implementation. auto: nccl when the tasks have GPUs, else ring."
    )
    chief: bool = Field(False, description="true: the first host runs task type 'chief', the others 'worker'.")
    collective_timeout_s: PosFloat | None = Field(
        None,
        description="CommunicationOptions(timeout_seconds). Default null: in TF 2.21 a timeout starts one "
        "thread per collective that sleeps for the whole timeout (thousands of threads, 3x slower steps, "
        "PID exhaustion); tfcluster's heartbeats and the pre-configured coordination-service heartbeat "
        "catch hung peers instead.",
    )
    legacy_keras: bool = Field(
        True,
        description="Set TF_USE_LEGACY_KERAS=1 so tf.keras is tf_keras (Keras 2). Keras 3 breaks multi-worker "
        "model.fit under MWMS in TF 2.21 (keras-team/keras#20585).",
    )


class JobSpec(_Model):
    command: list[ArgStr] = Field(
        description="The training command, as a list (preferred) or a string split like a shell would "
        "(never run through a shell)."
    )
    workdir: NonEmptyStr | None = Field(
        None, description="Working directory on each host. Default: the login directory."
    )
    python: Interpreter = Field("python3", description="Interpreter that runs worker_entry on each host.")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Extra environment for the training command."
    )
    instrument: bool = Field(
        True,
        description="Zero-code instrumentation (sitecustomize): progress heartbeats from Keras fit and fail-fast "
        "MWMS options when the script sets none. false: liveness and resource heartbeats only.",
    )
    startup_timeout_s: PosFloat = Field(
        300.0,
        description="Every task must start (its TF server listens, or it reports a strategy or a step) within "
        "this time, else the job is torn down: MWMS waits forever for a task that never starts.",
    )
    stop_grace_s: NonNegFloat = Field(
        10.0, description="On Ctrl-C / `tfcluster stop`: SIGTERM, wait this long (to save state), then SIGKILL."
    )
    failure_grace_s: NonNegFloat = Field(
        0.3,
        description="On teardown after a failure: SIGTERM, wait this long, then SIGKILL. An MWMS job that lost a "
        "peer cannot save anything collectively (and TensorFlow catches SIGTERM once MWMS exists), so waiting "
        "longer only keeps GPUs busy.",
    )
    remote_dir: NonEmptyStr = Field(
        "~/.tfcluster/runs",
        description="Per-job, per-task directories on the hosts (logs, exit status) live under this directory.",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split_string_command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split the command like a shell would: {exc}") from None
        return value

    @field_validator("command")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if not value or not value[0]:
            raise ValueError("must name a program to run, e.g. [python, train.py]")
        return value


class HeartbeatSpec(_Model):
    interval_s: Annotated[PosFloat, Field(le=3600)] = Field(1.0, description="Heartbeat period of every worker.")
    # (at most a day: the node's own limit on how long it waits for the launcher, which this sets)
    timeout_s: Annotated[PosFloat, Field(le=86400)] = Field(
        10.0,
        description="A worker silent this long is lost; a stopped (SIGSTOP) worker is hung. Must exceed interval_s.",
    )
    straggler_ratio: float = Field(
        1.5, gt=1, description="Flag a worker whose pre-all-reduce time exceeds this multiple of the others'."
    )
    progress_timeout_s: PosFloat | None = Field(
        600.0,
        description="Whole job making no training progress this long after its first step (a wedged collective) "
        "is hung. null: never.",
    )
    profile_interval_s: NonNegFloat = Field(
        10.0,
        description="Window of the step clock (in-graph timestamps around the gradient all-reduce) that finds "
        "stragglers: one sample per window. 0: off.",
    )
    kill_stragglers: bool = Field(False, description="true: a confirmed straggler tears the job down.")


class CheckpointSpec(_Model):
    dir: NonEmptyStr | None = Field(
        None,
        description="Checkpoint directory on the hosts (exported as TFCLUSTER_CHECKPOINT_DIR); the chief's copy "
        "is gathered. Default: a per-run directory under job.remote_dir.",
    )
    gather: bool = Field(True, description="Copy the chief's checkpoint directory to RUN/checkpoints after the job.")


class RestartSpec(_Model):
    max_restarts: Annotated[int, Field(strict=True, ge=0, le=100)] = Field(
        0,
        description="Relaunch all tasks together this many times after a failure (BackupAndRestore resumes).",
    )
    max_task_restarts: Annotated[int, Field(strict=True, ge=0, le=100)] = Field(
        3,
        description="parameter_server: restart a worker that died, alone and in place, this many times "
        "(the coordinator reschedules its work and it rejoins); past it the job fails.",
    )
    backup_dir: NonEmptyStr | None = Field(
        None,
        description="BackupAndRestore directory on the hosts (TFCLUSTER_BACKUP_DIR), the same for every attempt. "
        "Default: a per-run directory under job.remote_dir.",
    )
    min_workers: Annotated[int, Field(strict=True, ge=1, le=100_000)] | None = Field(
        None,
        description="When a host is lost for good and no spare is left, restart on the remaining workers while "
        "there are at least this many (TFCLUSTER_NUM_WORKERS tells the script). Default: the planned worker "
        "count (no shrinking). Each reshape counts against max_restarts.",
    )
    backup_shared: bool = Field(
        False,
        description="true: backup_dir is on storage every host shares (NFS, Lustre, a ReadWriteMany volume): "
        "nothing is copied. false (local disks): the launcher copies each new save of the chief's backup to "
        "RUN/backup/ while the job runs, and the next attempt resumes from it even if the chief's host is gone.",
    )
    backup_copy_interval_s: NonNegFloat = Field(
        10.0,
        description="How often the launcher looks for a new save in the chief's backup (one listing on that "
        "host) to copy it off the host. 0: never copied while the job runs.",
    )


class MetricsSpec(_Model):
    """Prometheus metrics of the running job, served by the launcher (text exposition format)."""

    port: Annotated[int, Field(strict=True, ge=0, le=65535)] | None = Field(
        None, description="Serve /metrics on this port while the job runs (0: any free port). null: off."
    )
    address: Address = Field(
        "127.0.0.1", description="Address to serve on; loopback by default (0.0.0.0 exposes it to the network)."
    )


class TensorboardSpec(_Model):
    """TensorBoard scalars of what tfcluster measures (step time and its split, rates, straggler scores,
    CPU, GPUs, goodput), written by the launcher: RUN/tensorboard/, or DIR/tfcluster/<run id>/."""

    enabled: bool = Field(True, description="Write them (false: no TensorBoard files).")
    dir: NonEmptyStr | None = Field(
        None,
        description="Your own TensorBoard log dir on the launcher's machine (~ allowed): events go to "
        "DIR/tfcluster/<run id>/ beside your runs; null: RUN/tensorboard/. `launch --tensorboard DIR` overrides it.",
    )


class CheckSpec(_Model):
    """`tfcluster check` and `launch --check`: every host's compute, the links and the all-reduce, measured."""

    timeout_s: PosFloat = Field(
        60.0,
        description="The whole check ends within this time (`check --timeout` overrides it); a task "
        "without figures by then is named (no_result).",
    )
    without_named_hosts: bool = Field(
        False,
        description="launch --check when the check names hosts: true starts the job on the remaining hosts "
        "(scheduler ssh only); false refuses to start (exit code 6).",
    )


class ClusterSpec(_Model):
    """A tfcluster cluster spec: where to run, what to run, and how to supervise it. What differs per
    scheduler (its section: ``hosts``, ``slurm``, ...) is the scheduler's: the model a spec is validated
    with is this one with every registered scheduler's fields (``sections.spec_model``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="tfcluster cluster spec")

    version: Literal[1] = Field(description="Spec format version. Only 1 exists.")
    name: str = Field(
        description="Job name: lowercase letters, digits and '-', 1-63 characters, starting with a letter or digit.",
        json_schema_extra={"pattern": JOB_NAME_RE.pattern},
    )
    scheduler: str = Field("", description="Who starts the tasks (the registered schedulers: sections.py).")
    tensorflow: TensorflowSpec = Field(default_factory=TensorflowSpec)
    job: JobSpec
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    restart: RestartSpec = Field(default_factory=RestartSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    tensorboard: TensorboardSpec = Field(default_factory=TensorboardSpec)
    check: CheckSpec = Field(default_factory=CheckSpec)
    logs: LogsSpec = Field(default_factory=LogsSpec)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if isinstance(value, str) and not JOB_NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid job name: use lowercase letters, digits and '-', "
                "1-63 characters, starting with a letter or digit"
            )
        return value


def is_loopback(address: str) -> bool:
    """Loopback addresses all reach this machine's one network stack."""
    if address.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
