"""The plan of a ``scheduler: ssh`` spec: one task per host, reached over SSH. Pure: the same spec and
``~/.ssh/config`` give the same plan."""

from __future__ import annotations

from ...plan import NodePlan, Plan
from ...plan.build import (
    job_dirs,
    node_env,
    plan_warnings,
    resolve_communication,
    role_slots,
    runtime_of,
    tf_cluster,
    tf_config_of,
)
from ...plan.model import WORKER_ENTRY_MODULE, bracket
from ...plan.policy import StragglerPolicy
from ...spec import ClusterSpec
from ...spec.roles import default_roles
from .targets import SshLookup, ssh_target


def ssh_plan(spec: ClusterSpec, *, run_id: str, local_user: str, ssh_lookup: SshLookup | None = None) -> Plan:
    """Resolve every host's SSH target, task, TF_CONFIG and environment.

    `ssh_lookup(address)` returns the ~/.ssh/config options for a host (paramiko's SSHConfig.lookup
    shape: hostname, user, port, identityfile, proxycommand); explicit spec values win over it.
    """
    hosts = spec.hosts or []
    with_roles = any(h.roles is not None for h in hosts)
    host_roles = [
        h.roles if h.roles is not None else default_roles(i, spec.tensorflow.chief and not with_roles)
        for i, h in enumerate(hosts)
    ]
    slots = role_slots(host_roles)  # (host, task, port offset), in rank order
    trainers = [hosts[h].gpus for h, t, _ in slots if t.type in ("chief", "worker")]
    gpus = trainers[0] if trainers else hosts[0].gpus
    warnings = plan_warnings(spec, gpus)
    targets = [ssh_target(spec, h, local_user, ssh_lookup, warnings) for h in hosts]
    tf_addrs = [h.tf_address or t.hostname for h, t in zip(hosts, targets, strict=True)]
    tf_ports = [(hosts[h].tf_port or spec.tensorflow.port) + off if off >= 0 else 0 for h, _, off in slots]
    tasks = [t for _, t, _ in slots]
    endpoints = [f"{bracket(tf_addrs[h])}:{port}" for (h, _, _), port in zip(slots, tf_ports, strict=True)]
    cluster = tf_cluster(tasks, endpoints)
    communication = resolve_communication(spec.tensorflow.communication, gpus)
    job_root, checkpoint_dir, backup_dir = job_dirs(spec, run_id)
    runtime = runtime_of(spec)
    nodes = []
    for k, (i, task, _) in enumerate(slots):
        host = hosts[i]
        tf_config = tf_config_of(cluster, task)
        env = node_env(spec, task, tf_config, communication, run_id, len(slots), host.gpus, checkpoint_dir, backup_dir)
        nodes.append(
            NodePlan(
                task=task,
                host=host.address,
                ssh=targets[i],
                tf_address=tf_addrs[i],
                tf_port=tf_ports[k],
                gpus=host.gpus,
                tf_config=tf_config,
                env=env,
                argv=(spec.job.python, "-m", WORKER_ENTRY_MODULE),
                command=tuple(spec.job.command),
                workdir=spec.job.workdir,
                remote_dir=f"{job_root}/{task.slug}",
                checkpoint_dir=checkpoint_dir,
                backup_dir=backup_dir,
                runtime=runtime,
            )
        )
    return Plan(
        job=spec.name,
        run_id=run_id,
        communication=communication,
        nodes=tuple(nodes),
        warnings=tuple(warnings),
        scheduler=spec.scheduler,
        policy=StragglerPolicy.from_spec(spec),
        strategy=spec.tensorflow.strategy,
    )
