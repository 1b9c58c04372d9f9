"""Problems every worker shares, judged in absolute terms. Pure.

The relative rules (``evidence``, ``gpus``, ``stragglers``) find the one worker that stands out; they
are blind when every worker is slow alike. Measured: three workers of the TensorFlow docs' Keras
tutorial on a 2-core box — every worker's training process waited for a CPU 66 % of its runnable time,
nobody stood out, and `report` called the job "communication-bound". The all-reduce the step clock
measures includes every host's wait for a CPU (the collective's own threads must run to send and
receive), so a CPU shortage on every host inflates it: the job is not communication-bound until its
workers get the CPU they ask for.

GPU faults, shared GPUs and power limits below the board's are judged in absolute terms by ``gpus``
itself; here: each host's CPU run-queue delay, CPU cgroup throttling and hypervisor steal, when every
worker has it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WAIT_PCT_MIN = 50.0  # run-queue delay at least as long as its run time (evidence's threshold for one worker)
THROTTLED_PCT_MIN = 10.0  # CPU cgroup throttled time per wall time
STEAL_PCT_MIN = 10.0  # CPU time the hypervisor gave to other guests


@dataclass(frozen=True)
class SharedProblem:
    """A problem of every worker's host (``kind``: "cpu wait", "cpu throttled", "steal")."""

    kind: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def _wait_pct(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Share of its runnable time a worker's threads waited for a CPU, over its samples (run and wait
    summed, so a long interval weighs more; else the mean of the samples' own shares)."""
    run = sum(float(s.get("run_ms") or 0.0) for s in samples)
    wait = sum(float(s.get("wait_ms") or 0.0) for s in samples)
    if run + wait > 0:
        return 100.0 * wait / (run + wait)
    pcts = [float(s["wait_pct"]) for s in samples if s.get("wait_pct") is not None]
    return sum(pcts) / len(pcts) if pcts else None


def _mean(samples: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [float(s[key]) for s in samples if s.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _every(values: Mapping[str, float | None], minimum: float) -> tuple[float, float, float] | None:
    """(lowest, median, highest) when every worker has the value and each is at least ``minimum``."""
    got = list(values.values())
    if not got or any(v is None or v < minimum for v in got):
        return None
    vals = [float(v) for v in got if v is not None]
    return min(vals), statistics.median(vals), max(vals)


def _span(lo: float, hi: float) -> str:
    return f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}%"


def shared_problems(hosts: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[SharedProblem]:
    """What every worker's host reports alike (``HostSample`` dicts per worker, over the window judged)."""
    hosts = {t: s for t, s in hosts.items() if s}
    if not hosts:
        return []
    out = []
    n = len(hosts)
    # a job with roles (a PS chief and ps, an evaluator) has tasks, not only workers: named as what they are
    noun = "worker" if all(t.partition(":")[0] == "worker" for t in hosts) else "task"
    every = f"the {noun}'s" if n == 1 else f"all {n} {noun}s'"
    hit = _every({t: _wait_pct(s) for t, s in hosts.items()}, WAIT_PCT_MIN)
    if hit:
        lo, mid, hi = hit
        out.append(
            SharedProblem(
                "cpu wait",
                f"{every} training processes waited for a CPU {_span(lo, hi)} of the time they were runnable "
                f"(run-queue delay, median {mid:.0f}%): more runnable threads than cores on every host — several "
                "workers or other jobs per host, too few cores, or CPU quotas",
                {"wait_pct_min": round(lo, 1), "wait_pct_median": round(mid, 1), "wait_pct_max": round(hi, 1)},
            )
        )
    hit = _every({t: _mean(s, "throttled_pct") for t, s in hosts.items()}, THROTTLED_PCT_MIN)
    if hit:
        lo, mid, hi = hit
        quotas = sorted({q for s in hosts.values() if (q := _mean(s, "quota_cpus"))})
        q = f" (quota {', '.join(f'{x:g}' for x in quotas)} CPU)" if quotas else ""
        out.append(
            SharedProblem(
                "cpu throttled",
                f"{every} CPU cgroups throttled them {_span(lo, hi)} of the time{q}: the CPU quota is too small "
                "for a worker",
                {"throttled_pct_median": round(mid, 1), "quota_cpus": quotas},
            )
        )
    hit = _every({t: _mean(s, "steal_pct") for t, s in hosts.items()}, STEAL_PCT_MIN)
    if hit:
        lo, mid, hi = hit
        out.append(
            SharedProblem(
                "steal",
                f"the hypervisor steals {_span(lo, hi)} of the CPU time on {every} hosts: the VMs' hosts are oversubscribed",
                {"steal_pct_median": round(mid, 1)},
            )
        )
    return out


def inflation_advice(problems: Sequence[SharedProblem], allreduce_ms: float, step_ms: float) -> str | None:
    """What a shared CPU problem means for the all-reduce the step clock measured, or None."""
    cpu = [p for p in problems if p.kind in ("cpu wait", "cpu throttled", "steal")]
    if not cpu or step_ms <= 0:
        return None
    return (
        f"the all-reduce time ({allreduce_ms:.1f} ms, {allreduce_ms / step_ms:.0%} of a step) is inflated by it: "
        "the step clock's all-reduce includes every host's wait for a CPU (the collective's threads must run to "
        "send and receive), so it is not the network's time: give the workers the CPU they need (fewer workers "
        "per host, more cores per worker, a larger quota), then measure again"
    )
