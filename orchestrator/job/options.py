"""How a launch runs: the command line's options, one frozen record every layer reads."""

from __future__ import annotations

from dataclasses import dataclass

from ..events.verdicts import CheckFinding
from ..supervise.bound import RunBound


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str | None = None
    preflight: bool = True
    gather: bool = True
    live: bool = True
    echo_logs: bool = True
    all_output: bool = False  # the console shows every line: no collapse, no noise filter (sinks.collapse)
    adopt_run_dir: bool = False  # --detach: the run directory was created for us (holds launcher.log)
    metrics_port: int | None = None  # overrides the spec's metrics.port
    bound: RunBound | None = None  # stop cleanly (a success) after N steps or D seconds of training
    detach: bool = False  # run in the background (or, under a scheduler, leave the job to it)
    command: tuple[str, ...] | None = None  # `launch -- COMMAND`: the job's command instead of the spec's
    tensorboard_dir: str | None = None  # `launch --tensorboard DIR`: overrides the spec's tensorboard.dir
    check_findings: tuple[
        CheckFinding, ...
    ] = ()  # `launch --check` named these hosts and started without them (events)
