"""Human-readable forms of plans (the --json form is the plan record, ``record.PlanRecord``). What differs
per scheduler — how a task is started, its default working directory, what is special about its
TF_CONFIG, extra lines such as the sbatch command — comes from the scheduler as ``PlanNotes``.

A dry run a person can read at thousands of tasks: what every task shares once (the cluster, the
command, the environment), then a table of the tasks, summarised past ``FULL_UP_TO`` rows (the first
and last ones and every one that differs from the rest; ``--all`` for every row); one task in full,
with its TF_CONFIG and whole environment, on demand (``plan --task``)."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.text import table
from .model import NodePlan, Plan, TaskId, task_env
from .roles import role_lines
from .secrets import redact_argv, redact_env, redact_path

#: The task table lists every task up to this many; beyond, the first and last few and those that differ.
FULL_UP_TO = 256
EDGE_ROWS = 5  # rows shown at each end of a summarised table
DIFFERENT_ROWS = 50  # at most this many rows that differ from the rest, then a count
CLUSTER_LISTED = 8  # a role's endpoints listed in full up to this many, else the first and the last


@dataclass(frozen=True)
class PlanNotes:
    started_by: Callable[[NodePlan], str]  # "  remote: ..." line of a task, without the label
    workdir_default: str = "~ (login directory)"
    tf_config_note: str = ""  # appended to the TF_CONFIG line (a template the task fills in, ...)
    extra: Sequence[str] = field(default=())  # lines after the table (the scheduler's own commands)
    backup_note: str | None = None  # where the backup lives when the scheduler says (pods: their volume)


def plan_text(plan: Plan, notes: PlanNotes, *, show_secrets: bool = False, every_task: bool = False) -> str:
    """``tfcluster plan``: the cluster and what every task shares once, then the table of tasks."""
    out = [
        f"job {plan.job}   run {plan.run_id}   {len(plan.nodes)} task(s)   communication {plan.communication}   "
        f"scheduler {plan.scheduler}",
        "",
        *_task_table(plan.nodes, every_task),
    ]
    if plan.spares:  # issue 34: they run nothing until a host is lost for good
        out += [
            "",
            f"spare hosts ({len(plan.spares)}, running nothing until a host is lost for good, then taking its "
            "place): " + ", ".join(plan.spares),
        ]
    if plan.has_roles:  # what each role's failure and end mean (plan.roles)
        out += ["", f"strategy {plan.strategy}:", *role_lines(plan.strategy)]
    for w in plan.warnings:
        out.append(f"warning: {w}")
    if notes.extra:
        out += ["", *notes.extra]
    if not plan.nodes:
        return "\n".join(out)
    first = plan.nodes[0]
    common = plan.common
    env = common.env if show_secrets else redact_env(common.env)
    out += [
        "",
        "every task:",
        notes.started_by(first),
        f"  command:    {_command(first, show_secrets)}",
        f"  workdir:    {redact_path(first.workdir, show_secrets) or notes.workdir_default}",
        f"  task dir:   {common.task_root}/<type>-<index>",
        f"  backup:     {redact_path(common.backup_dir, show_secrets)}   "
        + (notes.backup_note or _backup_note(common.backup_shared)),
        "  TF_CONFIG:  built on the node: the cluster below, the task's own type and index, rpc_layer grpc"
        + notes.tf_config_note,
        "  cluster:",
        *_cluster_lines(plan),
        "  env:",
        *[f"    {k}={v}" for k, v in env.items()],
        "  and each task's own: " + ", ".join(task_env(first.task, first.gpus, common.has_chief)),
        "",
        f"one task in full (its TF_CONFIG and environment): tfcluster plan SPEC --task {first.task}",
    ]
    return "\n".join(out)


def _backup_note(shared: bool) -> str:
    """Where the chief's BackupAndRestore backup survives the loss of its host (issue 34)."""
    if shared:
        return "(restart.backup_shared: every host sees it; nothing is copied)"
    return "(local disks: each new save of the chief's is copied to RUN/backup/, and every task resumes from it)"


def task_text(plan: Plan, node: NodePlan, notes: PlanNotes, *, show_secrets: bool = False) -> str:
    """``tfcluster plan --task TASK``: one task in full, its TF_CONFIG and whole environment."""
    env = node.env if show_secrets else redact_env(node.env)
    return "\n".join(
        [
            f"{node.task} on {node.host}   (job {plan.job}, run {plan.run_id}, {len(plan.nodes)} task(s))",
            notes.started_by(node),
            f"  ssh:        {node.ssh.user}@{node.ssh.hostname}:{node.ssh.port}" if node.ssh else "  ssh:        -",
            f"  TF address: {_address(node)}   GPUs {node.gpus}",
            f"  command:    {_command(node, show_secrets)}",
            f"  workdir:    {redact_path(node.workdir, show_secrets) or notes.workdir_default}",
            f"  task dir:   {node.remote_dir}",
            f"  TF_CONFIG:  {json.dumps(node.tf_config, separators=(',', ':'))}" + notes.tf_config_note,
            "  env:",
            *[f"    {k}={v}" for k, v in env.items()],
        ]
    )


def task_dict(node: NodePlan, *, show_secrets: bool = False) -> dict[str, Any]:
    """``plan --task TASK --json``: one task in full (what its NodeConfig and TF_CONFIG hold)."""
    return {
        "task": str(node.task),
        "host": node.host,
        **(
            {
                "ssh_host": node.ssh.hostname,
                "ssh_port": node.ssh.port,
                "user": node.ssh.user,
                "proxy_command": node.ssh.proxy_command,
                "jumps": [f"{j.user}@{j.hostname}:{j.port}" for j in node.ssh.jumps],
            }
            if node.ssh is not None
            else {}
        ),
        "tf_address": node.tf_endpoint,
        "gpus": node.gpus,
        "tf_config": node.tf_config,
        "env": node.env if show_secrets else redact_env(node.env),
        "argv": list(node.argv),
        "shell_line": node.shell_line(),
        "command": list(node.command) if show_secrets else redact_argv(node.command),
        "workdir": redact_path(node.workdir, show_secrets),
        "remote_dir": node.remote_dir,
        "checkpoint_dir": redact_path(node.checkpoint_dir, show_secrets),
        "backup_dir": redact_path(node.backup_dir, show_secrets),
    }


def find_task(plan: Plan, text: str) -> NodePlan:
    """The task ``text`` names (``worker:17``, ``worker-17``); a ValueError listing the plan's tasks."""
    task = TaskId.parse(text)
    for n in plan.nodes:
        if n.task == task:
            return n
    roles = Counter(n.task.type for n in plan.nodes)
    have = ", ".join(f"{r}:0..{r}:{k - 1}" if k > 1 else f"{r}:0" for r, k in roles.items())
    raise ValueError(f"{task} is not a task of this plan (it has {have})")


def _command(node: NodePlan, show_secrets: bool) -> str:
    return shlex.join(node.command if show_secrets else redact_argv(node.command))


def _address(node: NodePlan) -> str:
    if node.task.type == "evaluator":
        return "- (not in the cluster)"
    return f"{node.tf_address}:{node.tf_port or '<derived>'}"


def _row(n: NodePlan) -> tuple[str, ...]:
    ssh = f"{n.ssh.user}@{n.ssh.hostname}:{n.ssh.port}" if n.ssh else "-"
    return (str(n.task), n.host, ssh, _address(n), str(n.gpus))


def _shape(n: NodePlan) -> tuple[Any, ...]:
    """What makes a task unlike the others in a summarised table (not its name or address)."""
    return (n.task.type, n.gpus, n.ssh.user if n.ssh else None, n.ssh.port if n.ssh else None, n.tf_port)


def _task_table(nodes: Sequence[NodePlan], every_task: bool) -> list[str]:
    head = ("TASK", "HOST", "SSH", "TF ADDRESS", "GPUS")
    if every_task or len(nodes) <= FULL_UP_TO:
        return table([head, *(_row(n) for n in nodes)])
    usual = Counter(_shape(n) for n in nodes).most_common(1)[0][0]
    edge = set(range(EDGE_ROWS)) | set(range(len(nodes) - EDGE_ROWS, len(nodes)))
    odd = [i for i, n in enumerate(nodes) if i not in edge and _shape(n) != usual]
    shown = sorted(edge | set(odd[:DIFFERENT_ROWS]))
    lines = table([head, *(_row(nodes[i]) for i in shown)])  # column widths from real rows only
    out, last = [lines[0]], -1
    for i, line in zip(shown, lines[1:], strict=True):
        if i > last + 1:
            out.append(f"... {i - last - 1} more like these")
        out.append(line)
        last = i
    more = len(odd) - DIFFERENT_ROWS
    note = f"{len(nodes)} tasks: the first and last {EDGE_ROWS} and every task that differs from the rest shown"
    note += f" ({more} more that differ not shown)" if more > 0 else ""
    return [*out, f"({note}; --all lists every task)"]


def _cluster_lines(plan: Plan) -> list[str]:
    out = []
    for role, endpoints in plan.common.cluster.items():
        if len(endpoints) <= CLUSTER_LISTED:
            listed = ", ".join(endpoints)
        else:
            listed = f"{endpoints[0]}, {endpoints[1]}, ... {endpoints[-1]} (every one: the TF ADDRESS column)"
        out.append(f"    {role} ({len(endpoints)}): {listed}")
    return out or ["    (none)"]
