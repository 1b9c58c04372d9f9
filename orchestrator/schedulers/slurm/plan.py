"""The plan under Slurm: the same tasks and environment as over SSH, plus the sbatch and srun lines. Pure.

Slurm chooses the nodes, so each task builds its own TF_CONFIG when it starts
(``worker_entry.agent.modes.slurm``): its rank is ``SLURM_PROCID`` (plan order: chief first when there is one),
its peers are the step's nodes at their ``NodeAddr``, and every task computes the same port table.
The plan therefore carries the environment without TF_CONFIG, a TF_CONFIG *template* for display
(``<node 0>:<port 0>``), and the exact command lines tfcluster will run:

* ``sbatch_argv`` + ``batch_script``: from a login node, a batch job whose only line is
  ``exec PYTHON -m orchestrator slurm-batch RUN`` — every option is an argv element (no shell text,
  nothing secret), the script holds nothing but quoted paths;
* ``srun_argv``: inside the allocation, one step for all tasks: block distribution (rank → node is
  what the nodes compute), ``--kill-on-bad-exit`` (Slurm's own teardown layer).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from ...plan.build import (
    Placement,
    assign_tasks,
    build_plan,
    job_dirs,
    plan_warnings,
    resolve_communication,
    role_slots,
)
from ...plan.load import check_run_id
from ...plan.model import WORKER_ENTRY_MODULE, Plan
from ...plan.roles import rule_of
from ...runs.rundir import SLURM_DIR
from ...spec import ClusterSpec

BATCH_COMMAND = "slurm-batch"


def slurm_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    node_names: Sequence[str] | None = None,
    members: Sequence[str] | None = None,
    spares: Sequence[str] | None = None,
    planned_workers: int | None = None,
) -> Plan:
    """Every task in rank order. ``node_names`` (inside an allocation) labels the nodes; else node0...
    The first ``slurm.nodes`` run the job, the next ``slurm.spare_nodes`` stand by as its spares.
    ``members``/``spares``: a reshaped attempt's nodes (issue 34), in the allocation's order (the order
    Slurm gives a step's ranks)."""
    s = spec.slurm
    assert s is not None  # the spec rules require the section with scheduler: slurm
    named = [
        node_names[i] if node_names and i < len(node_names) else f"node{i}" for i in range(s.nodes + s.spare_nodes)
    ]
    labels = list(members) if members is not None else named[: s.nodes]
    if spares is not None:
        standby = tuple(spares)
    else:  # inside an allocation: only the nodes it holds (one without spare nodes has none)
        standby = tuple(node_names[s.nodes : s.nodes + s.spare_nodes]) if node_names else tuple(named[s.nodes :])
    n = len(labels) * s.tasks_per_node
    roles = dict(s.roles or {})
    tasks = [t for _, t, _ in role_slots([roles])] if roles else assign_tasks(n, spec.tensorflow.chief)
    gpus = s.gpus_per_node // s.tasks_per_node
    job_root, checkpoint_dir, backup_dir = job_dirs(spec, run_id)
    base = tf_port_base(spec)
    placements = []
    for rank, task in enumerate(tasks):
        label = labels[rank // s.tasks_per_node]  # block distribution
        placements.append(
            Placement(
                task=task,
                host=label,
                tf_address=f"<{label}>",
                tf_port=base or 0,
                gpus=gpus,
                endpoint=f"<{label}>:<port {rank}>",  # a template: each task fills in addresses and ports
            )
        )
    entry = ("slurm",)
    details = {
        "nodes": len(labels),
        "spare_nodes": s.spare_nodes,
        "tasks_per_node": s.tasks_per_node,
        "ntasks": n,
        "gpus_per_node": s.gpus_per_node,
        "tf_port_base": base,
        "requeue": s.requeue,
        "signal_lead_s": s.signal_lead_s,
        "max_requeues": s.max_requeues,
        "srun": srun_argv(spec, (spec.job.python, "-m", WORKER_ENTRY_MODULE, *entry), attempt=0, nodes=len(labels)),
    }
    run_dir = f"runs/{run_id}"  # what launch uses without --run-dir (made absolute when submitting)
    details["script"] = batch_script("python3", run_dir, run_id)
    details["sbatch"] = sbatch_argv(spec, run_dir, f"{run_dir}/{SLURM_DIR}/job.sh", run_id)
    warnings = plan_warnings(spec, gpus)
    if spec.job.stop_grace_s >= s.signal_lead_s > 0:
        warnings.append(
            f"job.stop_grace_s ({spec.job.stop_grace_s:g}) is not shorter than slurm.signal_lead_s "
            f"({s.signal_lead_s}): the save after the time-limit signal may not finish before Slurm kills the job"
        )
    return build_plan(
        spec,
        run_id,
        placements,
        entry=entry,
        task_root=job_root,
        dirs=(checkpoint_dir, backup_dir),
        communication=resolve_communication(spec.tensorflow.communication, gpus),
        warnings=warnings,
        extras=details,
        node_builds_cluster=True,
        roles=roles,
        spares=standby,
        planned_workers=planned_workers,
        # each rank's node: a node lost for good can leave the job with its tasks (issue 34)
        members=tuple(pl.host for pl in placements) if reshapable(spec) and node_names else (),
    )


def reshapable(spec: ClusterSpec) -> bool:
    """Whether a node lost for good can leave this job, all its tasks with it (with ``slurm.roles``: only
    for a spare node, ``fixed_roles``)."""
    return spec.slurm is not None


def fixed_roles(spec: ClusterSpec) -> str | None:
    """Why the job cannot go on with fewer nodes: its roles fill the step exactly (block distribution)."""
    s = spec.slurm
    if s is None or not s.roles:
        return None
    return "slurm.roles fill the step exactly (Slurm places the tasks by rank), so a node leaves only for a spare node"


def tf_port_base(spec: ClusterSpec) -> int | None:
    """``tensorflow.port`` when the spec sets it (tasks sharing an address count up from it); else
    None: the nodes derive a block from the job and step id."""
    return spec.tensorflow.port if "port" in spec.tensorflow.model_fields_set else None


def job_comment(run_id: str) -> str:
    """The Slurm job's comment: which run it is (``stop`` scancels only a job that says so)."""
    return f"tfcluster:{run_id}"


def sbatch_argv(spec: ClusterSpec, run_dir: str, script: str, run_id: str) -> list[str]:
    """``sbatch`` with every option as its own argument (validated values; no shell in between)."""
    s = spec.slurm
    assert s is not None
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={spec.name}",
        f"--comment={job_comment(run_id)}",
        f"--nodes={s.nodes + s.spare_nodes}",
        f"--ntasks-per-node={s.tasks_per_node}",
    ]
    if s.spare_nodes:
        argv.append("--no-kill")  # a node that fails must not take the allocation (and its spares) down
    if s.gpus_per_node:
        argv.append(f"--gpus-per-node={s.gpus_per_node}")
    for opt in ("partition", "account", "qos", "time", "constraint"):
        value = getattr(s, opt)
        if value is not None:
            argv.append(f"--{opt}={value}")
    if s.exclusive:
        argv.append("--exclusive")
    argv += [
        "--requeue" if s.requeue else "--no-requeue",
        # B: only the batch shell (our supervisor) gets it; it asks the tasks to save (SIGTERM + grace).
        # Not USR1: NCCL handles it.
        f"--signal=B:USR2@{s.signal_lead_s}",
        f"--output={run_dir}/{SLURM_DIR}/slurm-%j.out",
        "--open-mode=append",  # a requeued job appends to its output instead of truncating it
        *s.extra_args,
        script,
    ]
    return argv


def batch_script(python: str, run_dir: str, run_id: str) -> str:
    """The batch script: comments and one quoted exec line; options are on sbatch's command line."""
    return (
        "#!/bin/sh\n"
        f"# tfcluster run {check_run_id(run_id, 'run id')}: the supervisor runs inside the allocation and starts one srun step.\n"
        "# Generated; options are on the sbatch command line (RUN/slurm/sbatch.json). Nothing secret here:\n"
        "# the supervisor makes the run's connect-back secret in the allocation.\n"
        f"exec {shlex.quote(python)} -m orchestrator {BATCH_COMMAND} {shlex.quote(run_dir)}\n"
    )


def srun_argv(
    spec: ClusterSpec, entry: Sequence[str], *, attempt: int, nodes: int | None = None, overlap: bool = False
) -> list[str]:
    """One step for every task: block distribution (the nodes' TF_CONFIG assumes it), Slurm kills the
    step when a task exits non-zero (the first teardown layer). ``nodes``: this attempt's (a reshape).
    ``overlap``: an earlier step of this job is still on Slurm's books though its tasks are gone (a node
    that stopped answering: Slurm keeps the step until it marks that node DOWN, SlurmdTimeout later);
    without ``--overlap`` the new step would wait for its CPUs ("Requested nodes are busy")."""
    s = spec.slurm
    assert s is not None
    n = s.nodes if nodes is None else nodes
    argv = [
        "srun",
        f"--job-name={spec.name}-a{attempt}",
        f"--nodes={n}",
        f"--ntasks={n * s.tasks_per_node}",
        f"--ntasks-per-node={s.tasks_per_node}",
        "--distribution=block",
        # Slurm kills the step when a task exits non-zero: only when every role's failure takes the job
        # down (a restarted ps worker or a reported evaluator must leave the others running)
        f"--kill-on-bad-exit={1 if all_fatal(spec) else 0}",
        "--export=ALL",
        "--input=all",  # srun's stdin (the connect-back secret) reaches every task
    ]
    if overlap:
        argv.append("--overlap")
    if s.gpus_per_node:
        argv.append(f"--gpus-per-node={s.gpus_per_node}")
    return argv + list(entry)


def restart_srun_argv(spec: ClusterSpec, python: str, *, attempt: int, restart: int, node: str, slug: str) -> list[str]:
    """One task started again in place, inside the allocation: a one-task step on its node that shares
    the first step's resources (``--overlap``); it dials back as its old rank (``worker_entry connect``)
    and gets its TF_CONFIG from the supervisor."""
    s = spec.slurm
    assert s is not None
    argv = [
        "srun",
        f"--job-name={spec.name}-a{attempt}-{slug}-r{restart}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--export=ALL",
        "--input=all",
    ]
    if s.gpus_per_node:
        argv.append(f"--gpus-per-node={s.gpus_per_node}")
    return [*argv, python, "-m", WORKER_ENTRY_MODULE, "connect"]


def all_fatal(spec: ClusterSpec) -> bool:
    """Whether every task's failure tears the job down (``plan.roles``' table)."""
    s = spec.slurm
    assert s is not None
    roles = s.roles or {"worker": 1}
    return all(rule_of(spec.tensorflow.strategy, role).on_failure == "teardown" for role, n in roles.items() if n)


def describe(plan: Plan) -> list[str]:
    """The Slurm part of ``tfcluster plan``: how it runs and how each task builds TF_CONFIG."""
    d: dict[str, Any] = plan.extras or {}
    base = d.get("tf_port_base")
    script = ["    " + line for line in str(d.get("script", "")).splitlines()]
    return [
        f"slurm: {d.get('nodes')} node(s) x {d.get('tasks_per_node')} task(s), {d.get('gpus_per_node')} GPU(s) per node; "
        f"requeue {'on' if d.get('requeue') else 'off'} (at most {d.get('max_requeues')} after preemptions and "
        f"{d.get('max_requeues')} after time limits), save signal USR2 {d.get('signal_lead_s')} s before the limit",
        "  from a login node (tfcluster follows the job; Ctrl-C asks: cancel or detach):",
        f"    {shlex.join(d.get('sbatch') or [])}",
        f"  RUN/{SLURM_DIR}/job.sh:",
        *script,
        f"  inside the allocation: {shlex.join(d.get('srun') or [])}",
        "  TF_CONFIG: built by each task: rank = SLURM_PROCID (chief first; with roles: chiefs, workers, ps, evaluator), "
        "nodes = SLURM_STEP_NODELIST at their "
        "NodeAddr, block layout from SLURM_STEP_TASKS_PER_NODE, "
        + (f"ports from {base} up per shared address" if base else "ports derived from the job and step id")
        + " (distinct where tasks share an address)",
    ]
