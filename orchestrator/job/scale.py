"""`tfcluster scale`: run the user's job at several worker counts, each for a bounded time.

Each size is an ordinary launch (same supervision, teardown, logs and run directory) of the spec cut
to its first N hosts, bounded by the step clock's counters (``RunBound``), in ``SWEEP/workers-N``.
The scripts learn the size and the mode from ``TFCLUSTER_SCALE_*`` (``worker_entry.instrument.sweep``); what
each size really did is measured afterwards from its run directory (``views.scale``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from worker_entry.protocol.env import Env

from ..backends import Backend
from ..core.errors import UsageError
from ..plan import Plan
from ..spec import LoadedSpec
from ..supervise.bound import RunBound
from .job import LaunchOptions, launch

#: Step-clock windows of a sweep: several per size even for short runs, never below 2 s.
MIN_PROFILE_S = 2.0
MAX_PROFILE_S = 5.0
#: TensorFlow ignores SIGTERM once an MWMS exists: a measured size need not wait the spec's grace.
STOP_GRACE_S = 2.0


@dataclass(frozen=True)
class SweepOptions:
    sizes: tuple[int, ...]
    bound: RunBound
    root: Path  # the sweep's directory: one run directory per size below it
    strong: bool = False
    preflight: bool = True
    echo_logs: bool = False


@dataclass
class SizeRun:
    """One size of the sweep as it ran (the measurement comes from its run directory)."""

    workers: int
    run_dir: str
    state: str
    wall_s: float
    root_cause: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_sizes(text: str, hosts: int) -> tuple[int, ...]:
    """``--workers 1,2,4`` as sorted distinct sizes, each at most the spec's number of hosts."""
    sizes = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--workers {text!r}: expected worker counts like 1,2,4 (each at least 1)")
        sizes.add(int(part))
    too_many = sorted(n for n in sizes if n > hosts)
    if too_many:
        raise UsageError(f"--workers {text}: the spec has {hosts} host(s); {too_many[0]} workers need that many hosts")
    return tuple(sorted(sizes))


class SweepScheduler(Protocol):
    """What a sweep needs from the spec's scheduler (the CLI checks first that it can sweep)."""

    def plan(self, loaded: LoadedSpec, run_id: str) -> Plan: ...

    def backend(self, loaded: LoadedSpec, plan: Plan) -> Backend: ...


def sized_spec(loaded: LoadedSpec, workers: int, opts: SweepOptions) -> LoadedSpec:
    """The spec on its first ``workers`` hosts, telling the script the sweep's size and mode, with
    step-clock windows short enough for several per size."""
    spec = loaded.spec
    hosts = [h for h in spec.hosts or [] if not getattr(h, "spare", False)]  # a sweep's sizes run no spare
    env = {
        **spec.job.env,
        Env.SCALE_WORKERS: str(workers),
        Env.SCALE_BASE_WORKERS: str(opts.sizes[0]),
        Env.SCALE_MODE: "strong" if opts.strong else "weak",
    }
    # the step clock at every size, one worker too (auto mode stamps only multi-worker jobs), unless the
    # spec says otherwise: its step time and gradient bytes are what `tfcluster predict` starts from
    env.setdefault(Env.STEPCLOCK, "force")
    window = spec.heartbeat.profile_interval_s or MAX_PROFILE_S
    if opts.bound.seconds:
        window = min(window, max(MIN_PROFILE_S, opts.bound.seconds / 5))
    window = min(max(window, MIN_PROFILE_S), MAX_PROFILE_S)
    sized = spec.model_copy(
        update={
            "hosts": hosts[:workers],
            "job": spec.job.model_copy(
                update={"env": env, "instrument": True, "stop_grace_s": min(spec.job.stop_grace_s, STOP_GRACE_S)}
            ),
            "heartbeat": spec.heartbeat.model_copy(update={"profile_interval_s": window}),
        }
    )
    return LoadedSpec(spec=sized, path=loaded.path, text=loaded.text, warnings=loaded.warnings)


def run_sweep(
    loaded: LoadedSpec,
    opts: SweepOptions,
    scheduler: SweepScheduler,
    on_size: Callable[[SizeRun], None] | None = None,
) -> tuple[list[SizeRun], bool]:
    """Run every size in turn; (what ran, interrupted). A failed size does not stop the sweep (a
    size that cannot run says something too); Ctrl-C or SIGTERM does."""
    runs: list[SizeRun] = []
    for n in opts.sizes:
        sized = sized_spec(loaded, n, opts)
        plan = scheduler.plan(sized, f"{loaded.spec.name}-scale-{n}w-{int(time.time())}")
        run_dir = opts.root / f"workers-{n}"
        t0 = time.monotonic()
        try:
            result = launch(
                sized,
                plan,
                LaunchOptions(
                    run_dir=str(run_dir),
                    preflight=opts.preflight,
                    live=False,
                    echo_logs=opts.echo_logs,
                    bound=opts.bound,
                ),
                scheduler.backend(sized, plan),
            )
        except KeyboardInterrupt:  # between the job's own signal handling and ours
            return runs, True
        rc = result.root_cause
        run = SizeRun(
            n, str(run_dir), result.state.value, round(time.monotonic() - t0, 1), rc.to_dict() if rc else None
        )
        runs.append(run)
        if on_size is not None:
            on_size(run)
        if result.state.is_interrupted:
            return runs, True
    return runs, False
