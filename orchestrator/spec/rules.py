"""MWMS and networking rules across fields, run on the raw document (leniently: a malformed part is
skipped, so a type error elsewhere does not hide them)."""

from __future__ import annotations

from typing import Any

from ..core.diagnostics import Diagnostic, Severity
from .model import HeartbeatSpec, SshSpec, TensorflowSpec, is_loopback
from .roles import cluster_tasks, raw_roles, role_problems
from .yamlpos import Positions


def format_path(loc: Any) -> str:
    """('hosts', 1, 'gpus') -> 'hosts[1].gpus'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "spec"


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default


def _int_or(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def cross_field_problems(data: dict, filename: str, positions: Positions) -> list[Diagnostic]:
    """MWMS and networking rules that no single field can check. Malformed parts are skipped."""
    out: list[Diagnostic] = []

    def add(loc: tuple, message: str, severity: Severity = "error") -> None:
        out.append(Diagnostic.at(filename, positions.line_of(loc), format_path(loc), message, severity))

    out.extend(_scheduler_problems(data, filename, positions))
    hosts = _get(data, "hosts")
    hosts = hosts if isinstance(hosts, list) else []
    ssh = _get(data, "ssh", {})
    tf = _get(data, "tensorflow", {})
    default_ssh_port = _int_or(_get(ssh, "port"), SshSpec.model_fields["port"].default or 22)
    default_tf_port = _int_or(_get(tf, "port"), TensorflowSpec.model_fields["port"].default)
    out.extend(role_problems(data, hosts, filename, positions))
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
                    "machine its own tf_port"
                    + (" (a host with several tasks takes one port per task from its tf_port)" if n_ports > 1 else ""),
                )
                break
            seen_tf[tkey] = i

    hb = _get(data, "heartbeat", {})
    interval = _get(hb, "interval_s", HeartbeatSpec.model_fields["interval_s"].default)
    timeout = _get(hb, "timeout_s", HeartbeatSpec.model_fields["timeout_s"].default)
    if (
        isinstance(interval, int | float)
        and isinstance(timeout, int | float)
        and not isinstance(interval, bool)
        and not isinstance(timeout, bool)
        and timeout <= interval
    ):
        add(
            ("heartbeat", "timeout_s"),
            f"must exceed heartbeat.interval_s ({interval}); a worker would be declared lost between two "
            "heartbeats (use at least 3x the interval)",
        )

    if isinstance(_get(tf, "collective_timeout_s"), int | float) and not isinstance(
        _get(tf, "collective_timeout_s"), bool
    ):
        add(
            ("tensorflow", "collective_timeout_s"),
            "TensorFlow 2.21 starts one thread per collective that lives for the whole timeout: at ~100 "
            "collectives/s that is thousands of threads and much slower steps (docs/benchmarks.md). "
            "tfcluster's heartbeats already catch hung peers; prefer null",
            "warning",
        )

    if _get(_get(data, "check", {}), "without_named_hosts") is True and _get(data, "scheduler", "ssh") != "ssh":
        add(
            ("check", "without_named_hosts"),
            "leaving named hosts out needs a hosts: list (scheduler: ssh); under this scheduler launch --check "
            "refuses to start instead (set false)",
        )

    comm = _get(tf, "communication", "auto")
    if comm == "nccl" and gpu_counts and all(g == 0 for _, g in gpu_counts):
        add(
            ("tensorflow", "communication"),
            "nccl needs GPUs but every host has gpus: 0; TensorFlow will fall back with a warning (use auto or ring)",
            "warning",
        )
    return out


SCHEDULER_SECTIONS = {"ssh": "hosts", "slurm": "slurm", "kubernetes": "kubernetes"}


def _scheduler_problems(data: dict, filename: str, positions: Positions) -> list[Diagnostic]:
    """Each scheduler needs its own section and no other's (a `hosts:` list under Slurm is a mistake)."""
    scheduler = _get(data, "scheduler", "ssh")
    if scheduler not in SCHEDULER_SECTIONS:
        return []  # the field's own check reports it
    out = []
    own = SCHEDULER_SECTIONS[scheduler]
    if _get(data, own) is None:
        what = {
            "hosts": "a list of hosts, each with an address",
            "slurm": "a slurm: section (at least nodes)",
            "kubernetes": "a kubernetes: section (at least image, and workers or roles)",
        }[own]
        out.append(
            Diagnostic.at(
                filename,
                positions.line_of((own,)),
                own,
                f"required{'' if scheduler == 'ssh' else f' with scheduler: {scheduler}'}: {what}",
            )
        )
    for other in SCHEDULER_SECTIONS.values():
        if other != own and _get(data, other) is not None:
            out.append(
                Diagnostic.at(
                    filename,
                    positions.line_of((other,), key=True),
                    other,
                    f"not used with scheduler: {scheduler} (it uses {own}:); remove it, or set scheduler: "
                    + next(k for k, v in SCHEDULER_SECTIONS.items() if v == other),
                )
            )
    kube, name = _get(data, "kubernetes"), _get(data, "name")
    if isinstance(name, str) and _get(kube, "env_secret") == f"{name}-credentials":
        out.append(
            Diagnostic.at(
                filename,
                positions.line_of(("kubernetes", "env_secret")),
                "kubernetes.env_secret",
                f"{name}-credentials is the Secret tfcluster renders for job.env's credentials (and deletes with "
                "the job); give your own Secret another name",
            )
        )
    slurm = _get(data, "slurm")
    gpus, per_node = _get(slurm, "gpus_per_node", 0), _get(slurm, "tasks_per_node", 1)
    if (
        scheduler == "slurm"
        and isinstance(gpus, int)
        and isinstance(per_node, int)
        and per_node > 0
        and gpus % per_node
    ):
        out.append(
            Diagnostic.at(
                filename,
                positions.line_of(("slurm", "gpus_per_node")),
                "slurm.gpus_per_node",
                f"{gpus} GPUs per node do not split evenly among {per_node} tasks per node; MWMS needs the same "
                "number of GPUs on every task",
            )
        )
    return out
