"""``scheduler: kubernetes``: render a plan as a JobSet (or Indexed Jobs + a headless Service), validate it
offline, and run it — apply with the official ``kubernetes`` client, follow every pod's log (the pods'
channel: ``worker_entry.protocol.podlog``), stop by deleting what was applied.

Only ``backend``/``api`` import the ``kubernetes`` client, and only when a launch needs it; planning,
rendering and validating never do.
"""

from ..lazy import lazy_attributes
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


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["SECTION", *_LAZY]
