"""A command a scheduler adds to ``tfcluster`` (``render`` for Kubernetes, the hidden ``slurm-batch``).

The package lists them in ``COMMANDS`` (a light module: ``tfcluster --help`` loads it); the CLI adds each
with its help and example, and maps what ``run`` returns to the exit code (``cli.exitcodes``): None is
success, a ``RunResult`` the run's own code. A problem is raised (``UsageError``), never printed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchedulerCommand:
    name: str
    summary: str  # one line, for --help
    example: str  # one or more lines, for the command's --help
    arguments: Callable[[argparse.ArgumentParser], None]  # adds its arguments
    run: Callable[[argparse.Namespace], Any]  # None, or the RunResult of a run it supervised
    hidden: bool = False  # not listed in tfcluster --help (internal: what a batch script runs)
