"""Roles and strategies across hosts: which roles each strategy allows and how many of each, checked on
the raw document (leniently, like ``rules``) so every mistake is reported at its line at once."""

from __future__ import annotations

from typing import Any

from worker_entry.protocol.roles import CLUSTER_ROLES, ROLES

from ..core.diagnostics import Diagnostic, Severity
from .yamlpos import Positions

#: What each strategy allows: role -> (fewest, most) tasks over the whole job (None: no upper bound).
#: MWMS: the chief is optional (worker 0 is the chief then), one sidecar evaluator at most.
#: ParameterServerStrategy: exactly one chief (it runs the ClusterCoordinator), workers and ps tasks.
ALLOWED: dict[str, dict[str, tuple[int, int | None]]] = {
    "multi_worker_mirrored": {"chief": (0, 1), "worker": (0, None), "evaluator": (0, 1)},
    "parameter_server": {"chief": (1, 1), "worker": (1, None), "ps": (1, None), "evaluator": (0, 1)},
}
WHY = {
    ("multi_worker_mirrored", "ps"): "ps tasks hold variables only under strategy: parameter_server",
    ("multi_worker_mirrored", "chief"): "MWMS has one chief at most",
    ("multi_worker_mirrored", "evaluator"): "one sidecar evaluator watches the checkpoints",
    ("parameter_server", "chief"): "the chief runs the ClusterCoordinator: exactly one",
    ("parameter_server", "worker"): "the coordinator needs at least one worker to run steps on",
    ("parameter_server", "ps"): "the variables live on ps tasks: at least one",
    ("parameter_server", "evaluator"): "one sidecar evaluator watches the checkpoints",
}


def default_roles(index: int, chief: bool) -> dict[str, int]:
    """A host without ``roles``: one worker, or the chief for the first host with tensorflow.chief."""
    return {"chief": 1} if chief and index == 0 else {"worker": 1}


def cluster_tasks(roles: dict[str, int]) -> int:
    """How many of a host's tasks are in TF_CONFIG's cluster (each needs its own TF port)."""
    return sum(n for r, n in roles.items() if r in CLUSTER_ROLES)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def raw_roles(host: Any, index: int, chief: bool) -> dict[str, int]:
    """A raw host's roles with valid counts only (the field check reports the others)."""
    roles = host.get("roles") if isinstance(host, dict) else None
    if not isinstance(roles, dict):
        return default_roles(index, chief)
    return {r: _int(n) or 0 for r, n in roles.items() if r in ROLES and _int(n) is not None}


def role_problems(data: dict, hosts: list, filename: str, positions: Positions) -> list[Diagnostic]:
    """Which roles the strategy allows, how many of each, and where they can run."""
    out: list[Diagnostic] = []

    def add(loc: tuple, path: str, message: str, severity: Severity = "error") -> None:
        out.append(Diagnostic.at(filename, positions.line_of(loc), path, message, severity))

    tf = data.get("tensorflow") if isinstance(data.get("tensorflow"), dict) else {}
    strategy = tf.get("strategy", "multi_worker_mirrored")
    scheduler = data.get("scheduler", "ssh")
    if strategy not in ALLOWED:
        return out  # the field's own check names the allowed values
    if strategy != "multi_worker_mirrored" and scheduler != "ssh":
        add(("tensorflow", "strategy"), "tensorflow.strategy",
            f"{strategy} jobs run with scheduler: ssh only: mapping roles to Slurm tasks or Kubernetes pods is not "
            "done yet (allowed here: multi_worker_mirrored)")  # fmt: skip
        return out
    with_roles = [i for i, h in enumerate(hosts) if isinstance(h, dict) and "roles" in h]
    chief = tf.get("chief") is True
    if with_roles and chief:
        add(("tensorflow", "chief"), "tensorflow.chief",
            "with hosts[].roles, name the chief as a role (roles: {chief: 1}) and remove tensorflow.chief")  # fmt: skip
        chief = False
    if strategy == "parameter_server" and not with_roles and hosts:
        add(("tensorflow", "strategy"), "tensorflow.strategy",
            "parameter_server needs hosts[].roles: one chief, at least one worker and one ps, e.g. "
            "roles: {chief: 1} on one host and roles: {worker: 2, ps: 1} on another")  # fmt: skip
        return out
    allowed = ALLOWED[strategy]
    totals = dict.fromkeys(ROLES, 0)
    where: dict[str, list[int]] = {r: [] for r in ROLES}
    for i, h in enumerate(hosts):
        roles = raw_roles(h, i, chief)
        if i in with_roles and isinstance(h.get("roles"), dict) and not sum(roles.values()) and len(roles) == len(h["roles"]):
            add(("hosts", i, "roles"), f"hosts[{i}].roles", "runs no task: give a role a count of 1 or more, or remove the host")
        for r, n in roles.items():
            totals[r] += n
            if n:
                where[r].append(i)
    names = ", ".join(allowed)
    for r in ROLES:
        if r not in allowed:
            for i in where[r]:
                add(("hosts", i, "roles", r), f"hosts[{i}].roles.{r}",
                    f"not a role of strategy {strategy} ({WHY.get((strategy, r), '')}); allowed: {names}")  # fmt: skip
            continue
        lo, hi = allowed[r]
        if hi is not None and totals[r] > hi:
            i = where[r][-1]
            add(("hosts", i, "roles", r), f"hosts[{i}].roles.{r}",
                f"{totals[r]} {r} tasks over all hosts; strategy {strategy} allows at most {hi} ({WHY[(strategy, r)]})")  # fmt: skip
        if totals[r] < lo and hosts:
            add(("hosts",), "hosts", f"strategy {strategy} needs at least {lo} {r} task(s) ({WHY[(strategy, r)]}); "
                f"give a host roles: {{{r}: 1}}")  # fmt: skip
    if strategy == "multi_worker_mirrored" and hosts and not totals["chief"] + totals["worker"] and not out:
        add(("hosts",), "hosts", "no chief or worker task: MultiWorkerMirroredStrategy needs at least one to train")
    return out
