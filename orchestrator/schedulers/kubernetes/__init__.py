"""``scheduler: kubernetes``: render a plan as a JobSet (or Indexed Jobs + a headless Service), validate it
offline, and run it — apply with the official ``kubernetes`` client, follow every pod's log (the pods'
channel: ``worker_entry.protocol.podlog``), stop by deleting what was applied.

Only ``backend``/``api`` import the ``kubernetes`` client, and only when a launch needs it; planning,
rendering and validating never do.
"""

import importlib
from typing import Any

from .spec import SECTION

#: What the package offers, each loaded when first used: the spec reads SECTION alone (no launch code).
_LAZY = {
    "SCHEDULER": "scheduler",
    "KubernetesScheduler": "scheduler",
    "kubernetes_plan": "plan",
    "JOBSET_API": "manifests",
    "render": "manifests",
    "to_yaml": "manifests",
    "with_flavor": "manifests",
    "COMMANDS": "cli",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once: later imports find it here
    return value


__all__ = ["SECTION", *_LAZY]
