"""``scheduler: slurm``: a run spans allocations. From a login node ``launch`` submits a batch job whose
only line is ``tfcluster slurm-batch RUN`` and follows the run directory; inside an allocation each
attempt is one srun step whose tasks dial back (``step``); an allocation that ends under the job is a
requeue (``allocation``). ``commands`` wraps sbatch/srun/squeue/scontrol/sacct/scancel (no shell,
bounded, parsed strictly); ``handle`` is a run seen from outside the allocation."""

import importlib
from typing import Any

from .spec import SECTION

#: What the package offers, each loaded when first used: the spec reads SECTION alone (no launch code).
_LAZY = {
    "SCHEDULER": "scheduler",
    "SlurmScheduler": "scheduler",
    "slurm_plan": "plan",
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
