"""``scheduler: ssh`` in the spec: ``hosts:`` (one entry per host, its tasks by role) and ``ssh:`` (how to
reach them), the rules across hosts (GPU counts, SSH and TF ports) and where its jobs give roles."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from ...spec.model import (
    Address,
    GpuCount,
    LoginName,
    NonEmptyStr,
    NonNegFloat,
    Port,
    PosFloat,
    Role,
    SpecModel,
    TensorflowSpec,
    is_loopback,
)
from ...spec.roles import cluster_tasks, raw_roles
from ...spec.sections import Add, RoleHolders, SchedulerSection


class SshSpec(SpecModel):
    """How to reach every host; each host may override user, port and identity_file."""

    user: LoginName | None = Field(
        None, description="Login user. Default: ~/.ssh/config's User for the host, else the current user."
    )
    port: Port | None = Field(None, description="sshd port. Default: ~/.ssh/config's Port, else 22.")
    identity_file: NonEmptyStr | None = Field(
        None,
        description="Private key file on the launcher. The SSH agent and ~/.ssh/config are honoured too.",
    )
    known_hosts: NonEmptyStr = Field(
        "~/.ssh/known_hosts",
        description="known_hosts file on the launcher. Host keys are always verified; unknown keys are refused.",
    )
    connect_timeout_s: PosFloat = Field(10.0, description="TCP connect + SSH handshake timeout per host.")
    config_file: NonEmptyStr | None = Field(
        "~/.ssh/config",
        description="OpenSSH client config to honour (HostName, User, Port, IdentityFile). null: none.",
    )
    keepalive_s: NonNegFloat = Field(5.0, description="SSH keepalive interval; 0 disables.")


class HostSpec(SpecModel):
    """One MWMS task. Hosts run in list order: task index = position (after the chief, if any)."""

    address: Address = Field(description="IP address or hostname (or ~/.ssh/config alias) to ssh to.")
    gpus: GpuCount = Field(0, description="GPUs this task uses. MWMS needs the same count on every task.")
    port: Port | None = Field(None, description="sshd port of this host (overrides ssh.port).")
    user: LoginName | None = Field(None, description="Login user on this host (overrides ssh.user).")
    identity_file: NonEmptyStr | None = Field(
        None, description="Private key for this host (overrides ssh.identity_file)."
    )
    tf_port: Port | None = Field(None, description="gRPC port of this task (overrides tensorflow.port).")
    tf_address: Address | None = Field(
        None,
        description="Address the other tasks use to reach this one over gRPC, when it differs from the "
        "SSH address (e.g. a private training network). Default: the resolved SSH address.",
    )
    roles: dict[Role, Annotated[int, Field(strict=True, ge=0, le=64)]] | None = Field(
        None,
        description="Tasks this host runs, by role (chief, worker, ps, evaluator), e.g. {worker: 2, ps: 1}: "
        "each task on it after the first takes the next tf_port. Default: one worker (the chief, for the first "
        "host with tensorflow.chief). Which roles a strategy allows: tensorflow.strategy.",
    )
    spare: bool = Field(
        False,
        description="A spare host: checked by validate and preflight like any other, it runs nothing until a "
        "host is lost for good (lost, hung, a GPU fault, unreachable), then takes that host's place and all its "
        "tasks (no roles of its own) in the "
        "next attempt. Each such reshape counts against restart.max_restarts.",
    )


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default


def _int_or(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _rules(data: dict[str, Any], add: Add) -> None:
    """Across hosts: the same GPU count on every MWMS task, one task per (address, SSH port), distinct TF
    ports on one machine; nccl without GPUs."""
    hosts = _get(data, "hosts")
    hosts = hosts if isinstance(hosts, list) else []
    ssh = _get(data, "ssh", {})
    tf = _get(data, "tensorflow", {})
    default_ssh_port = _int_or(_get(ssh, "port"), SshSpec.model_fields["port"].default or 22)
    default_tf_port = _int_or(_get(tf, "port"), TensorflowSpec.model_fields["port"].default)
    chief = _get(tf, "chief") is True and not any(isinstance(h, dict) and "roles" in h for h in hosts)
    roles = [raw_roles(h, i, chief) for i, h in enumerate(hosts)]

    # MWMS runs the same replica count on every task; a different GPU count misbehaves silently.
    # (Not the sidecar evaluator's, which is outside the collective; ParameterServerStrategy has no such rule.)
    mwms = _get(tf, "strategy", "multi_worker_mirrored") == "multi_worker_mirrored"
    gpu_counts = [
        (i, _get(h, "gpus", 0))
        for i, h in enumerate(hosts)
        if isinstance(h, dict) and mwms and (roles[i].get("chief") or roles[i].get("worker"))
    ]
    gpu_counts = [(i, g) for i, g in gpu_counts if isinstance(g, int) and not isinstance(g, bool) and g >= 0]
    if gpu_counts:
        first_i, first_g = gpu_counts[0]
        for i, g in gpu_counts[1:]:
            if g != first_g:
                add(
                    ("hosts", i, "gpus"),
                    f"{g} GPUs but hosts[{first_i}] has {first_g}; MultiWorkerMirroredStrategy needs the same "
                    "number of GPUs on every task (use the same gpus: on every host)",
                )

    seen_ssh: dict[tuple[str, int], int] = {}
    seen_tf: dict[tuple[str, int], int] = {}
    for i, h in enumerate(hosts):
        address = _get(h, "address")
        if not isinstance(address, str):
            continue
        ssh_port = _int_or(_get(h, "port"), default_ssh_port)
        key = (address.lower(), ssh_port)
        if key in seen_ssh:
            add(
                ("hosts", i, "address"),
                f"{address} port {ssh_port} is already hosts[{seen_ssh[key]}]; every host entry is one task "
                "and needs its own (address, ssh port)",
            )
        else:
            seen_ssh[key] = i
        base_port = _int_or(_get(h, "tf_port"), default_tf_port)
        tf_addr = _get(h, "tf_address") if isinstance(_get(h, "tf_address"), str) else address
        machine = "loopback" if is_loopback(tf_addr) else tf_addr.lower()
        n_ports = cluster_tasks(roles[i])  # a host's tasks take tf_port, tf_port+1, ... (an evaluator none)
        if _get(h, "spare") is True:  # a spare takes a lost host's tasks: as many ports as the most any host has
            n_ports = max([n_ports, *(cluster_tasks(r) for r, o in zip(roles, hosts, strict=True) if o is not h)])
        if n_ports > 1 and base_port + n_ports - 1 > 65535:
            add(
                ("hosts", i, "roles"),
                f"{n_ports} tasks need TF ports {base_port}..{base_port + n_ports - 1}, past 65535; "
                "use a lower tf_port",
            )
        for tf_port in range(base_port, min(base_port + n_ports, 65536)):
            tkey = (machine, tf_port)
            if tkey in seen_tf:
                j = seen_tf[tkey]
                where = "loopback addresses share this machine's network stack" if machine == "loopback" else ""
                add(
                    ("hosts", i, "tf_port") if "tf_port" in h else ("hosts", i),
                    f"TF port {tf_port} is already used by hosts[{j}] on the same machine; TensorFlow's gRPC "
                    f"server binds every address{' (' + where + ')' if where else ''}, so give each task on one "
                    "machine its own tf_port" + _ports_note(n_ports, _get(h, "spare") is True),
                )
                break
            seen_tf[tkey] = i

    _spare_rules(hosts, tf, add)

    comm = _get(tf, "communication", "auto")
    if comm == "nccl" and gpu_counts and all(g == 0 for _, g in gpu_counts):
        add(
            ("tensorflow", "communication"),
            "nccl needs GPUs but every host has gpus: 0; TensorFlow will fall back with a warning (use auto or ring)",
            "warning",
        )


def _ports_note(n_ports: int, spare: bool) -> str:
    """Why a host needs more than one TF port, for the port-clash message ("" when it needs one)."""
    if n_ports <= 1:
        return ""
    if spare:
        return " (a spare takes one port per task of the host it replaces, from its tf_port)"
    return " (a host with several tasks takes one port per task from its tf_port)"


def _spare_rules(hosts: list[Any], tf: Any, add: Add) -> None:
    """A spare takes a lost host's place and all its tasks (its roles): under MWMS, with no roles of its
    own, and a host left to run."""
    spares = [i for i, h in enumerate(hosts) if _get(h, "spare") is True]
    if not spares:
        return
    strategy = _get(tf, "strategy", "multi_worker_mirrored")
    for i in spares:
        if strategy != "multi_worker_mirrored":
            add(
                ("hosts", i, "spare"),
                f"spare hosts need tensorflow.strategy: multi_worker_mirrored (this job is {strategy}); remove spare",
            )
        elif _get(hosts[i], "roles") is not None:
            add(
                ("hosts", i, "roles"),
                "a spare host has no roles of its own: it takes the tasks of the host it replaces; remove roles "
                "or spare",
            )
    if len(spares) == len(hosts):
        add(("hosts", spares[0], "spare"), "every host is a spare: at least one host must run the job")


def planned_workers(data: dict[str, Any]) -> int | None:
    """The job's training tasks (chief and workers) on its hosts that are not spares."""
    hosts = _get(data, "hosts")
    if not isinstance(hosts, list):
        return None
    chief = _get(_get(data, "tensorflow", {}), "chief") is True
    running = [h for h in hosts if isinstance(h, dict) and _get(h, "spare") is not True]
    return sum(r.get("chief", 0) + r.get("worker", 0) for r in (raw_roles(h, i, chief) for i, h in enumerate(running)))


def _roles(data: dict[str, Any]) -> RoleHolders | None:
    hosts = _get(data, "hosts")
    hosts = hosts if isinstance(hosts, list) else []
    return RoleHolders(
        holders=[(("hosts", i, "roles"), f"hosts[{i}].roles", _get(h, "roles")) for i, h in enumerate(hosts)],
        given=[i for i, h in enumerate(hosts) if isinstance(h, dict) and "roles" in h],
        field="hosts[].roles",
        example="roles: {chief: 1} on one host and roles: {worker: 2, ps: 1} on another",
        per_host=True,
    )


SECTION = SchedulerSection(
    name="ssh",
    key="hosts",
    fields={
        "ssh": (SshSpec, Field(default_factory=SshSpec)),
        "hosts": (
            list[HostSpec] | None,
            Field(None, min_length=1, description="scheduler ssh: one MWMS task per host, in this order."),
        ),
    },
    needs="a list of hosts, each with an address",
    package="orchestrator.schedulers.ssh.scheduler",
    rules=_rules,
    roles=_roles,
    workers=planned_workers,
    reshapes=True,
    default=True,
    per_host=True,
)
