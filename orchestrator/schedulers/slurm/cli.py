"""The command Slurm adds to ``tfcluster``: ``slurm-batch RUN``, the one line of the batch script a submit
writes (RUN/slurm/job.sh); hidden from ``--help``, not for users."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ...core.errors import UsageError
from ..command import SchedulerCommand


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN")


def _batch(args: argparse.Namespace) -> Any:
    """Supervise this allocation's share of the run: its RunResult (REQUEUED when the run goes on in the
    next allocation), or None."""
    if not os.path.isabs(args.run):
        raise UsageError("slurm-batch: RUN must be an absolute path")
    from .batch import run_batch

    return run_batch(args.run)


COMMANDS = [
    SchedulerCommand(
        name="slurm-batch",
        summary="Internal: supervise one Slurm allocation of a submitted run (what RUN/slurm/job.sh runs).",
        example="tfcluster slurm-batch /home/me/runs/resnet-4x8-20261122T101500Z",
        arguments=_arguments,
        run=_batch,
        hidden=True,
    )
]
