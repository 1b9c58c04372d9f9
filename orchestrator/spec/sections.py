"""What a scheduler registers with the spec: its sections, their rules and where its jobs give roles.

The spec names no scheduler. Each scheduler package holds a ``SchedulerSection`` (``SECTION`` in its
``__init__``); ``sections()`` finds them the first time the spec needs them — every package under
``PLUGINS`` — and ``register`` adds one from elsewhere (a scheduler outside this tree, one a test defines).
``spec_model()`` is the cluster spec's model with every registered section as a field and ``scheduler:``
allowing exactly the registered names; ``spec_schema()`` its JSON Schema (``tfcluster schema``).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..core.diagnostics import Severity
from .model import ClusterSpec

#: The package whose subpackages are the built-in schedulers, by name: found, never imported as code here.
PLUGINS = "orchestrator.schedulers"
#: Top-level keys of the spec and the plan record a section may not take.
RESERVED_KEYS = frozenset(ClusterSpec.model_fields) | {"cluster", "common", "tasks", "nodes", "extras"}

#: ``add(loc, message, severity="error", key=False)``: one problem at a location of the raw document.
Add = Callable[..., None]


@dataclass(frozen=True)
class RoleHolders:
    """Where a job's roles are given: host by host (SSH) or once for the whole job (a scheduler's section)."""

    holders: list[tuple[tuple[Any, ...], str, Any]]  # (location in the document, field path, raw roles)
    given: list[int]  # which holders set roles (the others take the default layout)
    field: str  # the field as the user writes it: hosts[].roles, slurm.roles
    example: str  # how to give them, for a message
    per_host: bool = False  # each holder is a host: a host without roles runs one worker


@dataclass(frozen=True)
class SchedulerSection:
    """One scheduler as the spec sees it."""

    name: str  # the value of ``scheduler:``
    key: str  # its own section: required with this scheduler, refused with another
    fields: dict[str, tuple[Any, Any]]  # top-level fields it adds to the spec: key -> (type, pydantic Field)
    needs: str  # what its section holds at least, for "required with scheduler: NAME: ..."
    package: str  # the module whose ``SCHEDULER`` serves it
    rules: Callable[[dict[str, Any], Add], None] | None = None  # its own rules across fields (raw document)
    roles: Callable[[dict[str, Any]], RoleHolders | None] | None = None  # where its jobs give roles
    default: bool = False  # ``scheduler:`` may be left out for this one
    per_host: bool = False  # a spec lists its hosts (launch --check may leave named hosts out)
    # the job's planned workers (chief and workers) from the raw document, None where it cannot say:
    # what ``restart.min_workers`` is checked against
    workers: Callable[[dict[str, Any]], int | None] | None = None
    reshapes: bool = False  # a host lost for good can leave the run (spares, restart.min_workers: issue 34)
    extras: dict[str, Any] = field(default_factory=dict)  # more, for the scheduler's own use


_LOCK = threading.RLock()
_REGISTERED: dict[str, SchedulerSection] = {}
_FOUND = False
_MODELS: dict[tuple[str, ...], type[ClusterSpec]] = {}


def register(section: SchedulerSection) -> None:
    """Add a scheduler's section (replacing one of the same name); a clash of keys is a ValueError."""
    with _LOCK:
        for other in _REGISTERED.values():
            taken = set(other.fields) & set(section.fields)
            if other.name != section.name and taken:
                raise ValueError(f"scheduler {section.name}: {', '.join(sorted(taken))} already belong to {other.name}")
        if set(section.fields) & RESERVED_KEYS or section.key not in section.fields:
            raise ValueError(f"scheduler {section.name}: its section must be one of its own, not a reserved key")
        _REGISTERED[section.name] = section


def unregister(name: str) -> None:
    """Remove a scheduler registered with ``register`` (one a test defined, when the test ends)."""
    with _LOCK:
        _REGISTERED.pop(name, None)


def sections() -> dict[str, SchedulerSection]:
    """Every registered scheduler, the built-in ones first found (once) under ``PLUGINS``."""
    global _FOUND
    with _LOCK:
        if not _FOUND:
            _FOUND = True
            package = importlib.import_module(PLUGINS)
            found = []
            for info in pkgutil.iter_modules(package.__path__):
                section = (
                    getattr(importlib.import_module(f"{PLUGINS}.{info.name}"), "SECTION", None) if info.ispkg else None
                )
                if isinstance(section, SchedulerSection) and section.name not in _REGISTERED:
                    found.append(section)
            for section in sorted(found, key=lambda s: (not s.default, s.name)):  # the default first
                register(section)
        return dict(_REGISTERED)


def section_named(name: Any) -> SchedulerSection | None:
    return sections().get(name) if isinstance(name, str) else None


def default_scheduler() -> str:
    found = sections()
    return next((s.name for s in found.values() if s.default), next(iter(found), ""))


def spec_model() -> type[ClusterSpec]:
    """The cluster spec's model: ``ClusterSpec`` with every registered section, ``scheduler:`` one of them."""
    found = sections()
    key = tuple(found)
    with _LOCK:
        model = _MODELS.get(key)
        if model is not None:
            return model
        names = tuple(found)
        choice = Literal.__getitem__(names) if names else str  # type: ignore[attr-defined]
        annotations: dict[str, Any] = {"scheduler": choice}
        namespace: dict[str, Any] = {
            "__module__": ClusterSpec.__module__,
            "__qualname__": "ClusterSpec",
            "scheduler": Field(
                default_scheduler(),
                description="Who starts the tasks: "
                + ", ".join(f"{s.name} (`{s.key}:`)" for s in found.values())
                + ". Default: "
                + default_scheduler()
                + ".",
            ),
            "model_config": ConfigDict(json_schema_extra=_schema_extra),
        }
        for s in found.values():
            for name, (tp, info) in s.fields.items():
                annotations[name] = tp
                namespace[name] = info
        namespace["__annotations__"] = annotations
        model = type("ClusterSpec", (ClusterSpec,), namespace)
        model.model_rebuild(force=True)
        _MODELS[key] = model
        return model


def spec_schema() -> dict[str, Any]:
    """``tfcluster schema``: the JSON Schema of a cluster spec, every registered scheduler included."""
    return spec_model().model_json_schema()


def _schema_extra(schema: dict[str, Any], _cls: Any = None) -> None:
    """Each scheduler needs its own section (``tfcluster validate`` says so at the right line)."""
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["allOf"] = [
        {
            "if": {
                "properties": {"scheduler": {"const": s.name}},
                **({} if s.default else {"required": ["scheduler"]}),
            },
            "then": {"required": [s.key]},
        }
        for s in sections().values()
    ]


def add_at(out: list, filename: str, positions: Any, path_of: Callable[[Any], str]) -> Add:
    """An ``Add`` that appends one ``Diagnostic`` per problem at the line of its location."""
    from ..core.diagnostics import Diagnostic

    def add(loc: tuple, message: str, severity: Severity = "error", key: bool = False) -> None:
        out.append(Diagnostic.at(filename, positions.line_of(loc, key=key), path_of(loc), message, severity))

    return add
