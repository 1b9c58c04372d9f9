"""tfcluster node side. Importing this package is instant and never imports TensorFlow."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Lazy public API (worker_entry.strategy / .progress import TensorFlow only when called).
_LAZY = {
    "make_strategy": ("strategy", "make_strategy"),
    "report_step": ("progress", "report_step"),
    "progress_callback": ("keras_callback", "progress_callback"),
    "sweep_batch_size": ("sweep", "sweep_batch_size"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{target[0]}", __name__), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
