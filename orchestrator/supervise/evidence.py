"""A slow worker's cause from its own host's evidence, and every worker's speed scores. Pure.

The step clock sees the time a worker spends outside the all-reduces. A worker starved of CPU (a
quota, a noisy neighbour, a hypervisor stealing) also stalls *inside* the ring all-reduce and after
it, where that signal cannot see it — and every worker then looks "communication-bound". Its host can
tell (``hoststats`` in each heartbeat): the run-queue delay of its threads, cgroup throttling, steal,
a low CPU clock; TCP retransmissions and NIC errors for a degraded link. A finding needs one worker to
stand out from the others, so a machine-wide condition (every worker on one overloaded box) names
nobody here (``shared`` judges those in absolute terms). GPUs are judged in ``gpus``.

Scores (as NVIDIA's resiliency extension computes them): per worker, *relative* = the fastest
worker's local work per step / its own, and *individual* = its own best window / its current one.
The individual score flags a worker that slows down over time (thermal drift, a noisy neighbour)
even when all workers were equally slow at first.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .figures import job_step_ms
from .gpus import CAUSES, GpuJudgement

WAIT_ODDS_MIN = 1.0  # a starved worker's threads wait for a CPU at least as long as they run (50 %)
WAIT_ODDS_RATIO = 2.5  # ... and 2.5x as long, per unit of CPU time, as the other workers' (median)
CORROBORATE_RATIO = 1.5  # enough when the step clock already names that very worker
THROTTLED_PCT_MIN = 10.0  # cgroup throttled time per wall time
STEAL_PCT_MIN = 10.0
EXPLAINS_SHARE = 0.5  # of the step clock's excess, for the run-queue delay to be named its cause
CPU_CLOCK_RATIO = 0.7  # current / maximum CPU frequency
RETRANS_PCT_MIN = 1.0


@dataclass(frozen=True)
class HostFinding:
    task: str
    cause: str  # "host CPU" | "network" | a GPU's (``gpus.CAUSES``)
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    run_queue: bool = False  # named by its threads' run-queue delay (not a quota, steal, a clock or a link)


def _mean(values: Sequence[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _stands_out(values: Mapping[str, float], minimum: float, margin: float) -> tuple[str, float, float] | None:
    """(task, its value, the others' median) when exactly one worker is above ``minimum`` and above
    the others' median by ``margin``."""
    if len(values) < 2:
        return None
    cand = max(values, key=lambda t: values[t])
    others = statistics.median(v for t, v in values.items() if t != cand)
    if values[cand] >= minimum and values[cand] - others >= margin:
        return cand, values[cand], others
    return None


def _median_of(samples: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [float(v) for s in samples if (v := s.get(key)) is not None]
    return statistics.median(vals) if vals else None


def _wait_odds(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Run-queue delay per unit of CPU time of a worker's threads over its samples (wait / run):
    near saturation it separates a starved worker far better than the share of time waiting."""
    run = sum(float(s.get("run_ms") or 0.0) for s in samples)
    wait = sum(float(s.get("wait_ms") or 0.0) for s in samples)
    if run > 0:
        return wait / run
    pcts = [float(s["wait_pct"]) for s in samples if s.get("wait_pct") is not None]
    if not pcts:
        return None
    pct = min(99.0, sum(pcts) / len(pcts))
    return pct / (100.0 - pct)


def _stands_out_ratio(values: Mapping[str, float], minimum: float, ratio: float) -> tuple[str, float, float] | None:
    """(task, its value, the others' median) when one worker is above ``minimum`` and ``ratio`` times
    the others' median."""
    if len(values) < 2:
        return None
    cand = max(values, key=lambda t: values[t])
    others = statistics.median(v for t, v in values.items() if t != cand)
    if values[cand] >= minimum and values[cand] >= ratio * max(others, 1e-3):
        return cand, values[cand], others
    return None


class _Digest(NamedTuple):
    """One worker's recent host samples, read in one pass (what ``host_suspect`` compares across
    workers): the means of the keys every worker is compared on, its wait odds, its retransmits."""

    throttled: float | None
    steal: float | None
    mhz: float | None
    max_mhz: float | None
    odds: float | None
    retrans: float | None


def _digest(samples: Sequence[Mapping[str, Any]]) -> _Digest:
    """The same figures as ``_mean``, ``_wait_odds`` and ``_median_of`` of each key (the same sums, in
    the same order), from one pass over the samples instead of one per key: at 4,096 workers a round's
    host evidence was 12,000 samples read ten times over (0.8 s of the launcher's CPU a round)."""
    th: list[float] = []
    st: list[float] = []
    mhz: list[float] = []
    mx: list[float] = []
    runs: list[float] = []
    waits: list[float] = []
    pcts: list[float] = []
    retrans: list[float] = []
    for s in samples:
        get = s.get
        if (v := get("throttled_pct")) is not None:
            th.append(float(v))
        if (v := get("steal_pct")) is not None:
            st.append(float(v))
        if (v := get("cpu_mhz")) is not None:
            mhz.append(float(v))
        if (v := get("cpu_max_mhz")) is not None:
            mx.append(float(v))
        runs.append(float(get("run_ms") or 0.0))
        waits.append(float(get("wait_ms") or 0.0))
        if (v := get("wait_pct")) is not None:
            pcts.append(float(v))
        if (v := get("tcp_retrans_pct")) is not None:
            retrans.append(float(v))
    run, odds = sum(runs), None
    if run > 0:
        odds = sum(waits) / run
    elif pcts:
        pct = min(99.0, sum(pcts) / len(pcts))
        odds = pct / (100.0 - pct)
    return _Digest(
        sum(th) / len(th) if th else None,
        sum(st) / len(st) if st else None,
        sum(mhz) / len(mhz) if mhz else None,
        sum(mx) / len(mx) if mx else None,
        odds,
        statistics.median(retrans) if retrans else None,
    )


def _avg(samples: Sequence[Mapping[str, Any]], key: str) -> float | None:
    return _mean([s.get(key) for s in samples])


def host_suspect(samples: Mapping[str, Sequence[Mapping[str, Any]]]) -> HostFinding | None:
    """The one worker whose host evidence explains slowness, from each worker's recent host samples
    (``HostSample`` dicts, oldest first), or None."""
    dig = {t: _digest(ss) for t, ss in samples.items() if ss}
    # a host whose cgroup is not readable (no cgroup mount in its namespace) counts as not throttled
    throttled = {t: d.throttled or 0.0 for t, d in dig.items()}
    hit = _stands_out(throttled, THROTTLED_PCT_MIN, THROTTLED_PCT_MIN)
    if hit:
        t, value, _ = hit
        quota = _avg(samples[t], "quota_cpus")
        q = f" (quota {quota:g} CPU)" if quota else ""
        return HostFinding(
            t,
            "host CPU",
            f"its CPU cgroup throttled it {value:.0f}% of the time{q}: a CPU quota (cgroup cpu.max / "
            f"cpu.cfs_quota_us) is too small for it",
            {"throttled_pct": round(value, 1), "quota_cpus": quota, "wait_pct": _round(_avg(samples[t], "wait_pct"))},
        )
    odds = {t: d.odds for t, d in dig.items() if d.odds is not None}
    hit = _stands_out_ratio(odds, WAIT_ODDS_MIN, WAIT_ODDS_RATIO)
    if hit:
        t = hit[0]
        value = 100.0 * odds[t] / (1.0 + odds[t])
        others = statistics.median(100.0 * o / (1.0 + o) for u, o in odds.items() if u != t)
        steal = dig[t].steal
        why = (
            f"{steal:.0f}% of the host's CPU time stolen by the hypervisor"
            if steal and steal >= STEAL_PCT_MIN
            else ("a CPU quota, a noisy neighbour or an oversubscribed host")
        )
        return HostFinding(
            t,
            "host CPU",
            f"its threads waited for a CPU {value:.0f}% of the time they were runnable (run-queue delay; "
            f"{others:.0f}% on the other workers): {why}",
            {"wait_pct": round(value, 1), "others_wait_pct": round(others, 1), "steal_pct": _round(steal)},
            run_queue=True,
        )
    steals = {t: d.steal for t, d in dig.items() if d.steal is not None}
    hit = _stands_out(steals, STEAL_PCT_MIN, STEAL_PCT_MIN)
    if hit:
        t, value, _ = hit
        return HostFinding(
            t, "host CPU", f"the hypervisor steals {value:.0f}% of its host's CPU time", {"steal_pct": value}
        )
    clocks = {t: d.mhz / d.max_mhz for t, d in dig.items() if d.mhz and d.max_mhz}
    slow = {t: 1.0 - r for t, r in clocks.items()}
    hit = _stands_out(slow, 1.0 - CPU_CLOCK_RATIO, 0.2)
    if hit:
        d = dig[hit[0]]
        return HostFinding(
            hit[0],
            "host CPU",
            f"its CPUs run at {d.mhz / 1000:.2f} GHz of {d.max_mhz / 1000:.2f} GHz (power or thermal limit)",  # type: ignore[operator]
            {"cpu_mhz": d.mhz, "cpu_max_mhz": d.max_mhz},
        )
    # a degraded link resends in most intervals; one burst (a peer's restart, a full socket buffer)
    # must not name a host: the median interval, not the mean
    retrans = {t: d.retrans for t, d in dig.items() if d.retrans is not None}
    hit = _stands_out(retrans, RETRANS_PCT_MIN, RETRANS_PCT_MIN)
    if hit:
        t, value, others = hit
        errors = _avg(samples[t], "net_errors")
        extra = f", {errors:.0f} NIC errors/drops per interval" if errors else ""
        return HostFinding(
            t,
            "network",
            f"its host retransmits {value:.1f}% of its TCP segments ({others:.1f}% elsewhere{extra}): a degraded link",
            {"tcp_retrans_pct": value},
        )
    return None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _delay_per_wall(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Run-queue delay of a worker's threads per wall second over its samples (summed over threads), or
    None when the samples do not say both."""
    wall = sum(float(s.get("interval_s") or 0.0) for s in samples) * 1000.0
    waits = [float(v) for s in samples if (v := s.get("wait_ms")) is not None]
    return sum(waits) / wall if wall > 0 and waits else None


def delay_explains(samples: Mapping[str, Sequence[Mapping[str, Any]]], finding: Any) -> bool:
    """Whether the run-queue delay can account for the excess the step clock measured on ``finding``'s
    worker: its threads' delay per wall second above the other workers' (median) must cover at least half
    of its excess share of a step. Wait odds (delay per CPU second) alone mislead here: a worker blocked
    in its input pipeline runs less CPU, so the same delay per wall second is more per CPU second and it
    looks starved; CI caught such a worker named "host CPU". True when the samples cannot say."""
    if finding is None or finding.step_ms <= 0:
        return True
    per_wall = {t: d for t, ss in samples.items() if ss and (d := _delay_per_wall(ss)) is not None}
    mine = per_wall.get(finding.task)
    others = [d for t, d in per_wall.items() if t != finding.task]
    if mine is None or not others:
        return True
    return mine - statistics.median(others) >= EXPLAINS_SHARE * finding.wait_ms / finding.step_ms


def starved(samples: Mapping[str, Sequence[Mapping[str, Any]]], task: str) -> str | None:
    """Corroboration for a worker the step clock already names: its threads wait for a CPU the longest
    per CPU second, at least CORROBORATE_RATIO times the others' median. The detail, or None."""
    odds = {t: o for t, ss in samples.items() if ss and (o := _wait_odds(ss)) is not None}
    hit = _stands_out_ratio(odds, WAIT_ODDS_MIN, CORROBORATE_RATIO)
    if hit is None or hit[0] != task:
        return None
    mine = 100.0 * odds[task] / (1.0 + odds[task])
    others = statistics.median(100.0 * o / (1.0 + o) for t, o in odds.items() if t != task)
    return (
        f"its threads waited for a CPU {mine:.0f}% of the time they were runnable (run-queue delay; {others:.0f}% on "
        "the other workers): a CPU quota, a noisy neighbour or an oversubscribed host"
    )


# ------------------------------------------------------------------------------------- the scores


@dataclass
class Scores:
    """Relative and individual speed per worker, from the local work per step (``pre_collective_ms``:
    the time outside collectives) of each profile round."""

    history: int = 3  # windows in a worker's current speed (median)
    warmup: int = 2  # rounds before a worker's best counts
    _local: dict[str, list[float]] = field(default_factory=dict)
    _best: dict[str, float] = field(default_factory=dict)

    def update(self, profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
        current: dict[str, float] = {}
        for task, rec in profiles.items():
            local = rec.get("pre_collective_ms")
            if local is None:
                continue
            seen = self._local.setdefault(task, [])
            seen.append(float(local))
            del seen[: -max(self.history, 8)]
            now = statistics.median(seen[-self.history :])  # one odd window does not move it
            current[task] = now
            if len(seen) > self.warmup:
                self._best[task] = min(self._best.get(task, now), now)
        if not current:
            return {}
        fastest = min(current.values())
        out = {}
        for task, now in current.items():
            best = self._best.get(task)
            out[task] = {
                "local_ms": round(now, 2),
                "relative": round(fastest / now, 3) if now > 0 else 1.0,
                "individual": round(best / now, 3) if best and now > 0 else 1.0,
                "best_local_ms": round(best, 2) if best else None,
            }
        return out


def explain(
    finding: Any,
    hosts: Mapping[str, Sequence[Mapping[str, Any]]],
    gpus: GpuJudgement | None,
    profiles: Mapping[str, Mapping[str, Any]],
    host_found: tuple[HostFinding | None] | None = None,
) -> Any:
    """The straggler of a round (a ``StragglerFinding`` from the step clock, or None) with what the
    hosts and the GPU judgement say: a GPU problem or a starved host on the same worker names the
    cause; one worker's host or GPU evidence alone names it even when the step clock cannot (its stall
    is inside the all-reduce). ``host_found``: ``(host_suspect(hosts),)`` when the caller has it already
    (``report`` at 4,096 tasks: a second pass over every host sample was half a second)."""
    from dataclasses import replace

    from .stragglers import StragglerFinding

    gpus = gpus or GpuJudgement()
    suspect = gpus.suspect()
    gpu = HostFinding(*suspect) if suspect else None
    host = host_suspect(hosts) if host_found is None else host_found[0]
    if finding is not None:
        own = sorted(gpus.of(finding.task), key=lambda p: list(CAUSES).index(p.problem))
        if own and finding.cause in ("compute", "other"):
            return replace(finding, cause=CAUSES[own[0].problem], detail="; ".join(p.text() for p in own))
        if host is not None and host.task == finding.task:
            if host.run_queue and not delay_explains(hosts, finding):
                return finding  # the delay is too small for the excess the step clock measured
            return replace(finding, cause=host.cause, detail=f"{host.detail}; {finding.detail}")
        weak = starved(hosts, finding.task) if host is None else None
        if weak is not None and delay_explains(hosts, finding):  # a starved worker's parts only echo it
            return replace(finding, cause="host CPU", detail=f"{weak}; {finding.detail}")
        if host is None:
            return finding  # (another worker's GPU problem is not what this step waits for)
    other = host or gpu  # one worker's host evidence outranks the step clock's
    if other is None:
        return finding
    pre = {t: float(p["pre_collective_ms"]) for t, p in profiles.items() if p.get("pre_collective_ms") is not None}
    rest = [v for t, v in pre.items() if t != other.task]
    wait = max(0.0, pre.get(other.task, 0.0) - statistics.median(rest)) if rest and other.task in pre else 0.0
    return StragglerFinding(
        task=other.task,
        wait_ms=wait,
        step_ms=job_step_ms(profiles.values()),
        cause=other.cause,
        pre_ms=pre,
        detail=other.detail,
    )
