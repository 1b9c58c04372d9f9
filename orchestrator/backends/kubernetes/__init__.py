"""The Kubernetes backend: render a plan as a JobSet (or Indexed Jobs + a headless Service), validate
it offline, and run it — apply with the official ``kubernetes`` client, follow every pod's log (the
pods' channel: ``worker_entry.protocol.podlog``), stop by deleting what was applied.

Only ``backend``/``api`` import the ``kubernetes`` client, and only when a launch needs it; rendering
and validating never do.
"""

from .render import JOBSET_API, render, to_yaml, with_flavor

__all__ = ["JOBSET_API", "render", "to_yaml", "with_flavor"]
