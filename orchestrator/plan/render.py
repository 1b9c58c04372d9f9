"""Human-readable forms of plans and problems (the --json forms are the objects' to_dict)."""

from __future__ import annotations

import json
import shlex

from ..core.text import table
from .model import Plan
from .secrets import redact_argv, redact_env


def plan_text(plan: Plan, *, show_secrets: bool = False) -> str:
    rows = [("TASK", "HOST", "SSH", "TF ADDRESS", "GPUS")]
    for n in plan.nodes:
        rows.append(
            (
                str(n.task),
                n.host,
                f"{n.ssh.user}@{n.ssh.hostname}:{n.ssh.port}" if n.ssh else "-",
                f"{n.tf_address}:{n.tf_port or '<derived>'}",
                str(n.gpus),
            )
        )
    out = [
        f"job {plan.job}   run {plan.run_id}   {len(plan.nodes)} task(s)   communication {plan.communication}",
        "",
        *table(rows),
    ]
    for w in plan.warnings:
        out.append(f"warning: {w}")
    if plan.slurm is not None:
        from .slurm import describe

        out += ["", *describe(plan)]
    for n in plan.nodes:
        env = n.env if show_secrets else redact_env(n.env)
        out += [
            "",
            f"{n.task} on {n.host}",
            f"  remote:     {n.shell_line()}   (config on stdin)"
            if n.ssh is not None
            else f"  started by: slurm ({shlex.join(n.argv)}; config over the connect-back channel)"
            if plan.scheduler == "slurm"
            else f"  pod runs:   {shlex.join(n.argv)} -- COMMAND   (settings in the pod spec: tfcluster render)",
            f"  command:    {shlex.join(n.command if show_secrets else redact_argv(n.command))}",
            f"  workdir:    {n.workdir or ('the image WORKDIR' if plan.scheduler == 'kubernetes' else '~ (login directory)')}",
            f"  task dir:   {n.remote_dir}",
            f"  TF_CONFIG:  {json.dumps(n.tf_config, separators=(',', ':'))}"
            + ("   (template: the task fills in addresses and ports)" if plan.scheduler == "slurm" else ""),
            "  env:",
        ]
        out += [f"    {k}={v}" for k, v in env.items() if k != "TF_CONFIG"]
    return "\n".join(out)
