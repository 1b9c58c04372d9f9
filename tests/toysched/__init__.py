"""A fourth scheduler from outside ``orchestrator/``: ``scheduler: toy`` runs one task per machine listed in
its own ``toy:`` section. It proves a scheduler is one package: registered with ``spec.sections.register``,
its section is validated (its fields, its rules, its roles), its jobs planned, shown and recorded, and its
command offered, by a core that names it nowhere (``tests/test_toy_scheduler.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from orchestrator.spec.model import Address, GpuCount, Port, Role, SpecModel
from orchestrator.spec.sections import Add, RoleHolders, SchedulerSection


class ToySpec(SpecModel):
    """The toy's machines: one task each, in this order."""

    machines: list[Address] = Field(min_length=1, description="Where the tasks run, one each.")
    gpus: GpuCount = Field(0, description="GPUs per task.")
    port: Port = Field(7000, description="Every task's TF port.")
    roles: dict[Role, Annotated[int, Field(strict=True, ge=0, le=64)]] | None = Field(
        None, description="Tasks by role, as many as machines."
    )


def _rules(data: dict[str, Any], add: Add) -> None:
    """One task per machine: a machine listed twice is an error at its line."""
    machines = data["toy"].get("machines") if isinstance(data["toy"], dict) else None
    seen: dict[str, int] = {}
    for i, m in enumerate(machines if isinstance(machines, list) else []):
        if not isinstance(m, str):
            continue  # the field's own check says what it should be
        if m in seen:
            add(("toy", "machines", i), f"{m} is already machines[{seen[m]}]: the toy runs one task per machine")
        seen.setdefault(m, i)


def _roles(data: dict[str, Any]) -> RoleHolders | None:
    section = data.get("toy")
    if not isinstance(section, dict):
        return None
    return RoleHolders(
        holders=[(("toy", "roles"), "toy.roles", section.get("roles"))],
        given=[0] if section.get("roles") is not None else [],
        field="toy.roles",
        example="toy.roles: {chief: 1, worker: 1, ps: 1}",
    )


SECTION = SchedulerSection(
    name="toy",
    key="toy",
    fields={"toy": (ToySpec | None, Field(None, description="scheduler toy: the machines."))},
    needs="a toy: section (at least machines)",
    package="toysched.scheduler",
    rules=_rules,
    roles=_roles,
)


def __getattr__(name: str) -> Any:
    if name == "COMMANDS":  # as a built-in package offers them: loaded when the CLI asks
        from .scheduler import COMMANDS

        return COMMANDS
    raise AttributeError(name)
