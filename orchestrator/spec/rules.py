"""MWMS and networking rules across fields, run on the raw document (leniently: a malformed part is
skipped, so a type error elsewhere does not hide them)."""

from __future__ import annotations

from typing import Any

from ..core.diagnostics import Diagnostic
from .model import HeartbeatSpec
from .roles import format_loc as format_path
from .roles import role_problems
from .sections import Add, SchedulerSection, add_at, default_scheduler, section_named, sections
from .yamlpos import Positions


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default


def cross_field_problems(data: dict, filename: str, positions: Positions) -> list[Diagnostic]:
    """Rules no single field can check: the scheduler's section, roles, the scheduler's own rules
    (``SchedulerSection.rules``), heartbeats. Malformed parts are skipped."""
    out: list[Diagnostic] = []
    add = add_at(out, filename, positions, format_path)
    section = _scheduler_problems(data, add)
    out.extend(role_problems(data, section, filename, positions))
    if section is not None and section.rules is not None and _get(data, section.key) is not None:
        section.rules(data, add)

    _min_workers_problems(data, section, add)

    hb = _get(data, "heartbeat", {})
    interval = _get(hb, "interval_s", HeartbeatSpec.model_fields["interval_s"].default)
    timeout = _get(hb, "timeout_s", HeartbeatSpec.model_fields["timeout_s"].default)
    if (
        isinstance(interval, int | float)
        and isinstance(timeout, int | float)
        and not isinstance(interval, bool)
        and not isinstance(timeout, bool)
        and timeout <= interval
    ):
        add(
            ("heartbeat", "timeout_s"),
            f"must exceed heartbeat.interval_s ({interval}); a worker would be declared lost between two "
            "heartbeats (use at least 3x the interval)",
        )

    tf = _get(data, "tensorflow", {})
    if isinstance(_get(tf, "collective_timeout_s"), int | float) and not isinstance(
        _get(tf, "collective_timeout_s"), bool
    ):
        add(
            ("tensorflow", "collective_timeout_s"),
            "TensorFlow 2.21 starts one thread per collective that lives for the whole timeout: at ~100 "
            "collectives/s that is thousands of threads and much slower steps (docs/benchmarks.md). "
            "tfcluster's heartbeats already catch hung peers; prefer null",
            "warning",
        )

    if _get(_get(data, "check", {}), "without_named_hosts") is True and section is not None and not section.per_host:
        lists = ", ".join(f"scheduler: {s.name}" for s in sections().values() if s.per_host)
        add(
            ("check", "without_named_hosts"),
            f"leaving named hosts out needs a list of hosts ({lists}); under this scheduler launch --check "
            "refuses to start instead (set false)",
        )
    return out


def _scheduler_problems(data: dict, add: Add) -> SchedulerSection | None:
    """Each scheduler needs its own section and no other's (a `hosts:` list under Slurm is a mistake).
    Returns the spec's scheduler (None when ``scheduler:`` names none: the field's own check says so)."""
    found = sections()
    section = section_named(_get(data, "scheduler", default_scheduler()))
    if section is None:
        return None
    if _get(data, section.key) is None:
        where = "" if section.default else f" with scheduler: {section.name}"
        add((section.key,), f"required{where}: {section.needs}")
    for other in found.values():
        if other.name != section.name and _get(data, other.key) is not None:
            add(
                (other.key,),
                f"not used with scheduler: {section.name} (it uses {section.key}:); remove it, or set scheduler: "
                + other.name,
                key=True,
            )
    return section


def _min_workers_problems(data: dict, section: SchedulerSection | None, add: Add) -> None:
    """``restart.min_workers`` against the plan: 1 <= K <= the planned workers, under MWMS (a job with
    parameter servers keeps its shape: its coordinator restarts a worker in place)."""
    k = _get(_get(data, "restart", {}), "min_workers")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return  # absent, or the field's own check says what is allowed
    strategy = _get(_get(data, "tensorflow", {}), "strategy", "multi_worker_mirrored")
    if strategy != "multi_worker_mirrored":
        add(
            ("restart", "min_workers"),
            f"reshaping to fewer workers needs tensorflow.strategy: multi_worker_mirrored (this job is {strategy}: "
            "its coordinator restarts a lost worker in place); remove min_workers",
        )
        return
    if section is not None and not section.reshapes:
        add(
            ("restart", "min_workers"),
            f"not used with scheduler: {section.name} yet: a host lost for good ends the run as before (only "
            "scheduler: ssh reshapes a job); checked against the plan all the same",
            "warning",
        )
    planned = section.workers(data) if section is not None and section.workers is not None else None
    if planned and k > planned:  # (no planned worker at all is its own error: every host a spare)
        add(
            ("restart", "min_workers"),
            f"{k} is more than the {planned} planned workers; allowed: 1 to {planned} (default {planned}: "
            "no shrinking)",
        )
