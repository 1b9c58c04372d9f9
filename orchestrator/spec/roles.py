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


def role_problems(data: dict, section: Any, filename: str, positions: Positions) -> list[Diagnostic]:
    """Which roles the strategy allows, how many of each, and where they can run: where the spec's
    scheduler says its jobs give them (``section.roles``: host by host, or once for the job)."""
    out: list[Diagnostic] = []

    def add(loc: tuple, path: str, message: str, severity: Severity = "error") -> None:
        out.append(Diagnostic.at(filename, positions.line_of(loc), path, message, severity))

    tf = data.get("tensorflow") if isinstance(data.get("tensorflow"), dict) else {}
    strategy = tf.get("strategy", "multi_worker_mirrored")
    if not isinstance(strategy, str) or strategy not in ALLOWED:  # (a list here was a TypeError)
        return out  # the field's own check names the allowed values
    layout = section.roles(data) if section is not None and section.roles is not None else None
    if layout is None:
        return out  # the scheduler's own checks report a missing section
    chief = tf.get("chief") is True
    holders, given, field, per_host = layout.holders, layout.given, layout.field, layout.per_host
    scope = "over all hosts" if per_host else "in the job"
    if given and chief:
        add(
            ("tensorflow", "chief"),
            "tensorflow.chief",
            f"with {field}, name the chief as a role (roles: {{chief: 1}}) and remove tensorflow.chief",
        )
        chief = False
    if strategy == "parameter_server" and not given and holders:
        add(
            ("tensorflow", "strategy"),
            "tensorflow.strategy",
            f"parameter_server needs {field}: one chief, at least one worker and one ps, e.g. {layout.example}",
        )
        return out
    if not per_host and not given:
        return out  # the scheduler's default layout: chief (tensorflow.chief) and workers only
    allowed = ALLOWED[strategy]
    totals = dict.fromkeys(ROLES, 0)
    where: dict[str, list[int]] = {r: [] for r in ROLES}
    for k, (loc, path, raw) in enumerate(holders):
        roles = raw_roles({"roles": raw} if k in given else None, k, chief)
        if k in given and isinstance(raw, dict) and not sum(roles.values()) and len(roles) == len(raw):
            add(
                loc,
                path,
                "runs no task: give a role a count of 1 or more" + (", or remove the host" if per_host else ""),
            )
        for r, n in roles.items():
            totals[r] += n
            if n:
                where[r].append(k)
    names = ", ".join(allowed)
    for r in ROLES:
        if r not in allowed:
            for k in where[r]:
                loc, path, _ = holders[k]
                add(
                    (*loc, r),
                    f"{path}.{r}",
                    f"not a role of strategy {strategy} ({WHY.get((strategy, r), '')}); allowed: {names}",
                )
            continue
        lo, hi = allowed[r]
        if hi is not None and totals[r] > hi:
            loc, path, _ = holders[where[r][-1]]
            add(
                (*loc, r),
                f"{path}.{r}",
                f"{totals[r]} {r} tasks {scope}; strategy {strategy} allows at most {hi} ({WHY[(strategy, r)]})",
            )
        if totals[r] < lo and holders:
            loc, path, _ = holders[0]
            top = loc[:1] if per_host else loc  # host by host: the list itself
            fix = f"give a host roles: {{{r}: 1}}" if per_host else f"set {path}.{r}: 1"
            add(
                top,
                format_loc(top) if per_host else path,
                f"strategy {strategy} needs at least {lo} {r} task(s) ({WHY[(strategy, r)]}); {fix}",
            )
    clean = all(
        isinstance(raw, dict) and all(r in ROLES and _int(n) is not None for r, n in raw.items())
        for k, (_, _, raw) in enumerate(holders)
        if k in given
    )
    if not clean:
        return out  # the fields' own checks name the bad role or count: totals from the rest would mislead
    if strategy == "multi_worker_mirrored" and holders and not totals["chief"] + totals["worker"] and not out:
        top = holders[0][0][:1] if per_host else holders[0][0]
        add(
            top,
            format_loc(top) if per_host else holders[0][1],
            "no chief or worker task: MultiWorkerMirroredStrategy needs at least one to train",
        )
    return out


def format_loc(loc: tuple[Any, ...]) -> str:
    """('hosts', 1, 'gpus') -> 'hosts[1].gpus'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"
