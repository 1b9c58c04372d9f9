"""``scheduler: ssh``: the launcher itself starts one task per spec host over SSH (``backends.ssh``), and
reaches the hosts again for ``preflight`` and a later ``gather``; ``scale`` cuts the host list."""

import importlib
from typing import Any

from .spec import SECTION

#: What the package offers, each loaded when first used: the spec reads SECTION alone (no launch code).
_LAZY = {
    "SCHEDULER": "scheduler",
    "SshScheduler": "scheduler",
    "ssh_plan": "plan",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once: later imports find it here
    return value


__all__ = ["SECTION", *_LAZY]
