"""``scheduler: ssh``: the launcher itself starts one task per spec host over SSH (``backends.ssh``), and
reaches the hosts again for ``preflight`` and a later ``gather``; ``scale`` cuts the host list."""

from ..lazy import lazy_attributes
from .spec import SECTION

#: What the package offers, each loaded when first used: the spec reads SECTION alone (no launch code).
_LAZY = {
    "SCHEDULER": "scheduler",
    "SshScheduler": "scheduler",
    "ssh_plan": "plan",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["SECTION", *_LAZY]
