"""``scheduler: slurm``: a run spans allocations. From a login node ``launch`` submits a batch job whose
only line is ``tfcluster slurm-batch RUN`` and follows the run directory; inside an allocation each
attempt is one srun step whose tasks dial back (``step``); an allocation that ends under the job is a
requeue (``allocation``). ``commands`` wraps sbatch/srun/squeue/scontrol/sacct/scancel (no shell,
bounded, parsed strictly); ``handle`` is a run seen from outside the allocation."""

from ..lazy import lazy_attributes
from .spec import SECTION

#: What the package offers, each loaded when first used: the spec reads SECTION alone (no launch code).
_LAZY = {
    "SCHEDULER": "scheduler",
    "SlurmScheduler": "scheduler",
    "slurm_plan": "plan",
    "COMMANDS": "cli",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["SECTION", *_LAZY]
