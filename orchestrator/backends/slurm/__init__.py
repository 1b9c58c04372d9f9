"""Slurm: ``commands`` wraps sbatch/srun/squeue/scontrol/sacct/scancel (bounded, validated); ``step``
is the backend inside an allocation (one srun step per attempt, tasks connect back)."""

from . import commands
from .commands import JobInfo, SlurmError
from .step import SlurmStepBackend, advertise_address, allocation_nodes

__all__ = ["JobInfo", "SlurmError", "SlurmStepBackend", "advertise_address", "allocation_nodes", "commands"]
