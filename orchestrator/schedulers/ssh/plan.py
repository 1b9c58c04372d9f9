"""The plan of a ``scheduler: ssh`` spec: one task per host, reached over SSH. Pure: the same spec and
``~/.ssh/config`` give the same plan."""

from __future__ import annotations

from ...plan import NodePlan, Plan
from ...plan.build import (
    assign_tasks,
    job_dirs,
    node_env,
    plan_warnings,
    resolve_communication,
    runtime_of,
    tf_cluster,
    tf_config_of,
)
from ...plan.model import WORKER_ENTRY_MODULE, bracket
from ...plan.policy import StragglerPolicy
from ...spec import ClusterSpec
from .targets import SshLookup, ssh_target


def ssh_plan(spec: ClusterSpec, *, run_id: str, local_user: str, ssh_lookup: SshLookup | None = None) -> Plan:
    """Resolve every host's SSH target, task, TF_CONFIG and environment.

    `ssh_lookup(address)` returns the ~/.ssh/config options for a host (paramiko's SSHConfig.lookup
    shape: hostname, user, port, identityfile, proxycommand); explicit spec values win over it.
    """
    hosts = spec.hosts or []
    warnings = plan_warnings(spec, hosts[0].gpus)
    targets = [ssh_target(spec, h, local_user, ssh_lookup, warnings) for h in hosts]
    tf_addrs = [h.tf_address or t.hostname for h, t in zip(hosts, targets, strict=True)]
    tf_ports = [h.tf_port or spec.tensorflow.port for h in hosts]
    endpoints = [f"{bracket(a)}:{p}" for a, p in zip(tf_addrs, tf_ports, strict=True)]
    tasks = assign_tasks(len(hosts), spec.tensorflow.chief)
    cluster = tf_cluster(tasks, endpoints)
    gpus = hosts[0].gpus
    communication = resolve_communication(spec.tensorflow.communication, gpus)
    job_root, checkpoint_dir, backup_dir = job_dirs(spec, run_id)
    runtime = runtime_of(spec)
    nodes = []
    for i, host in enumerate(hosts):
        task = tasks[i]
        tf_config = tf_config_of(cluster, task)
        env = node_env(spec, task, tf_config, communication, run_id, len(hosts), gpus, checkpoint_dir, backup_dir)
        nodes.append(
            NodePlan(
                task=task,
                host=host.address,
                ssh=targets[i],
                tf_address=tf_addrs[i],
                tf_port=tf_ports[i],
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
    )
