"""tfcluster's node side. Importing this package is instant and never imports TensorFlow.

Three parts that share only ``protocol/`` (the contract with the launcher), each in its own process:

- ``agent/``: the node agent, ``python -m worker_entry`` (stdlib only, never TensorFlow);
- ``instrument/``: inside the user's training process (step clock, Keras callbacks, ``make_strategy``);
- ``check/``: ``python -m worker_entry.check``, what ``tfcluster check`` runs on every node;

and ``examples/``, training scripts written as a user would write them. The public API below (and
``worker_entry.progress``) re-exports what training scripts call.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Lazy public API (the instrument modules import TensorFlow only when called).
_LAZY = {
    "make_strategy": ("instrument.strategy", "make_strategy"),
    "report_step": ("instrument.progress", "report_step"),
    "report_loss": ("instrument.progress", "report_loss"),
    "report_evaluation": ("instrument.progress", "report_evaluation"),
    "progress_callback": ("instrument.keras_callback", "progress_callback"),
    "sweep_batch_size": ("instrument.sweep", "sweep_batch_size"),
    "reshaped_batch_size": ("instrument.sweep", "reshaped_batch_size"),
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
