"""The plan of a ``scheduler: ssh`` spec: each host's tasks (one, or its roles), reached over SSH. Pure: the same spec and
``~/.ssh/config`` give the same plan."""

from __future__ import annotations

from collections import Counter

from ...plan import Plan
from ...plan.build import (
    Placement,
    build_plan,
    job_dirs,
    plan_warnings,
    resolve_communication,
    role_slots,
)
from ...plan.model import bracket
from ...spec import ClusterSpec
from ...spec.roles import default_roles
from .targets import SshLookup, ssh_target


def host_labels(spec: ClusterSpec) -> list[str]:
    """How each host is named among the job's members: its address, with its SSH port where another host
    has the same address (every host entry is one (address, port): the spec's rule). One pass over the
    hosts: the addresses are counted once, not per host (at 4,096 hosts a scan per host was 16.8 M
    comparisons, most of a launch's start)."""
    hosts = spec.hosts or []
    seen = Counter(h.address.lower() for h in hosts)
    return [
        h.address if seen[h.address.lower()] == 1 else f"{h.address}:{h.port or spec.ssh.port or 22}" for h in hosts
    ]


def ssh_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    local_user: str,
    ssh_lookup: SshLookup | None = None,
    members: tuple[str, ...] | None = None,
    spares: tuple[str, ...] | None = None,
    planned_workers: int | None = None,
    roles: dict[str, dict[str, int]] | None = None,
) -> Plan:
    """Resolve every host's SSH target and each task's place (its host, TF address and port).

    `ssh_lookup(address)` returns the ~/.ssh/config options for a host (paramiko's SSHConfig.lookup
    shape: hostname, user, port, identityfile, proxycommand); explicit spec values win over it.
    ``members``: the hosts that run (``host_label``s, in this order; default: every host not a spare),
    ``spares`` the ones standing by (default: the spare hosts), ``roles`` each member's tasks by role
    where they are not its own (a spare in a lost host's place takes its tasks; a worker takes a lost
    chief) — a reshaped attempt's plan (issue 34).
    """
    every = spec.hosts or []
    labels = host_labels(spec)
    if members is None:
        members = tuple(label for label, h in zip(labels, every, strict=True) if not h.spare)
    if spares is None:
        spares = tuple(label for label, h in zip(labels, every, strict=True) if h.spare)
    index = {label: i for i, label in reversed(list(enumerate(labels)))}  # the first of equal labels, as .index
    hosts = [every[index[m]] for m in members]
    with_roles = any(h.roles is not None for h in hosts) or bool(roles)
    given = roles or {}
    host_roles = [
        given.get(m) or h.roles or default_roles(i, spec.tensorflow.chief and not with_roles)
        for i, (m, h) in enumerate(zip(members, hosts, strict=True))
    ]
    slots = role_slots(host_roles)  # (host, task, port offset), in rank order
    trainers = [hosts[h].gpus for h, t, _ in slots if t.type in ("chief", "worker")]
    gpus = trainers[0] if trainers else hosts[0].gpus
    warnings = plan_warnings(spec, gpus)
    targets = [ssh_target(spec, h, local_user, ssh_lookup, warnings) for h in hosts]
    tf_addrs = [h.tf_address or t.hostname for h, t in zip(hosts, targets, strict=True)]
    placements = []
    for i, task, offset in slots:
        port = (hosts[i].tf_port or spec.tensorflow.port) + offset if offset >= 0 else 0
        placements.append(
            Placement(
                task=task,
                host=hosts[i].address,
                tf_address=tf_addrs[i],
                tf_port=port,
                gpus=hosts[i].gpus,
                endpoint=f"{bracket(tf_addrs[i])}:{port}",
                ssh=targets[i],
            )
        )
    job_root, checkpoint_dir, backup_dir = job_dirs(spec, run_id)
    return build_plan(
        spec,
        run_id,
        placements,
        task_root=job_root,
        dirs=(checkpoint_dir, backup_dir),
        communication=resolve_communication(spec.tensorflow.communication, gpus),
        warnings=warnings,
        spares=spares,
        planned_workers=planned_workers,
        members=tuple(members[h] for h, _, _ in slots),
    )
