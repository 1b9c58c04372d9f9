"""Human-readable forms of plans (the --json form is ``Plan.to_dict``). What differs per scheduler —
how a task is started, its default working directory, what is special about its TF_CONFIG, extra
lines such as the sbatch command — comes from the scheduler as ``PlanNotes``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.text import table
from .model import NodePlan, Plan
from .roles import role_lines
from .secrets import redact_argv, redact_env


@dataclass(frozen=True)
class PlanNotes:
    started_by: Callable[[NodePlan], str]  # "  remote: ..." line of a task, without the label
    workdir_default: str = "~ (login directory)"
    tf_config_note: str = ""  # appended to the TF_CONFIG line (a template the task fills in, ...)
    extra: Sequence[str] = field(default=())  # lines after the table (the scheduler's own commands)


def plan_text(plan: Plan, notes: PlanNotes, *, show_secrets: bool = False) -> str:
    rows = [("TASK", "HOST", "SSH", "TF ADDRESS", "GPUS")]
    for n in plan.nodes:
        rows.append(
            (
                str(n.task),
                n.host,
                f"{n.ssh.user}@{n.ssh.hostname}:{n.ssh.port}" if n.ssh else "-",
                f"{n.tf_address}:{n.tf_port or '<derived>'}"
                if n.task.type != "evaluator"
                else "- (not in the cluster)",
                str(n.gpus),
            )
        )
    out = [
        f"job {plan.job}   run {plan.run_id}   {len(plan.nodes)} task(s)   communication {plan.communication}",
        "",
        *table(rows),
    ]
    if plan.has_roles:  # what each role's failure and end mean (plan.roles)
        out += ["", f"strategy {plan.strategy}:", *role_lines(plan.strategy)]
    for w in plan.warnings:
        out.append(f"warning: {w}")
    if notes.extra:
        out += ["", *notes.extra]
    for n in plan.nodes:
        env = n.env if show_secrets else redact_env(n.env)
        out += [
            "",
            f"{n.task} on {n.host}",
            notes.started_by(n),
            f"  command:    {shlex.join(n.command if show_secrets else redact_argv(n.command))}",
            f"  workdir:    {n.workdir or notes.workdir_default}",
            f"  task dir:   {n.remote_dir}",
            f"  TF_CONFIG:  {json.dumps(n.tf_config, separators=(',', ':'))}" + notes.tf_config_note,
            "  env:",
        ]
        out += [f"    {k}={v}" for k, v in env.items() if k != "TF_CONFIG"]
    return "\n".join(out)
