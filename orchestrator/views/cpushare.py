"""Own work per step when k workers share one machine's cores: a processor-sharing estimate from one run.

The scaling model keeps a worker's own work per step constant in N: every new worker brings its own cores.
Where several workers land on one machine (slots, network namespaces, pods on a node: tasks whose hosts
report the same kernel boot id) they share its cores, and each worker's own work grows (issue 32: 10.3 →
~31 ms with three workers on two cores). What one measured run says about it:

- ``d``: the cores a worker kept busy while it stepped (the step clock's ``cpu_ms`` / ``step_ms``);
- ``w``: the share of its runnable time it waited for a CPU (the heartbeats' run-queue delay);
- ``C``: the usable cores (the machine's CPU count; with a cgroup quota per worker below it, k workers'
  quotas together, at most the machine's cores: pods with quotas on one node do not share one quota).

Processor sharing: T runnable threads on C cores get min(1, C/T) of a core each. The worker's runnable
demand is ``r = d / (1 - w)``; the machine's total during the run ``T1 = C / (1 - w)`` when it waited (else
just ``r``: no sign of anyone else), so the others' demand is ``B = max(0, T1 - r)``. Workers of one job
step together (their own work coincides), so k of them on that machine: ``Tk = B + k·r``, and own work
grows by ``max(1, Tk/C) / max(1, T1/C)``. Pure, on plain records.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Waiting for a CPU under this share of runnable time is noise, not a sign of others on the cores.
WAIT_NOISE = 0.05
#: Own work inflated by more than this factor at a size: the model's "constant own work" does not hold there.
INFLATED = 1.25


@dataclass(frozen=True)
class CpuShare:
    """One run's CPU figures: ``demand_cores`` (d), ``wait`` (w, 0..1), ``cores`` (C), ``per_machine`` (the
    most of its workers that shared one machine)."""

    demand_cores: float
    wait: float
    cores: float
    per_machine: int = 1
    quota: float | None = None  # each worker's cgroup CPU quota, where it is below the machine's cores

    def pool(self, k: int) -> float:
        """The cores k workers on one machine can use together: the machine's, or their quotas' sum."""
        return min(self.cores, max(1, k) * self.quota) if self.quota else self.cores

    @property
    def runnable(self) -> float:
        return self.demand_cores / max(1e-6, 1.0 - self.wait)

    @property
    def total_at_run(self) -> float:
        """The machine's runnable threads during the run (T1)."""
        if self.wait < WAIT_NOISE:
            return self.runnable * self.per_machine
        return self.pool(self.per_machine) / max(1e-6, 1.0 - self.wait)

    @property
    def others(self) -> float:
        """The demand of everything else on the machine (B), from the run's wait."""
        return max(0.0, self.total_at_run - self.runnable * self.per_machine)

    def inflation(self, k: int) -> float:
        """How much a worker's own work per step grows with ``k`` workers on the machine against the run."""
        if self.quota:  # each worker held to its own quota: they share only the machine's cores, once past them
            return max(1.0, max(1, k) * min(self.quota, self.runnable) / self.cores)
        tk = self.others + max(1, k) * self.runnable
        return max(1.0, max(1.0, tk / self.cores) / max(1.0, self.total_at_run / self.cores))

    def as_json(self) -> dict[str, Any]:
        return {
            "cores_busy_per_worker": round(self.demand_cores, 3),
            "cpu_wait_pct": round(100 * self.wait, 1),
            "usable_cores": round(self.pool(1), 2),
            "machine_cores": round(self.cores, 2),
            "quota_cores": None if self.quota is None else round(self.quota, 2),
            "others_runnable": round(self.others, 2),
            "workers_per_machine": self.per_machine,
        }


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def machines_of(ready: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """task → its machine: the kernel boot id its hello reported, else its hostname (task_ready events)."""
    return {str(e["task"]): str(e.get("machine") or e.get("hostname") or e.get("host")) for e in ready}


def share_of(
    profiles: Sequence[Mapping[str, Any]],
    heartbeats: Sequence[Mapping[str, Any]],
    ready: Sequence[Mapping[str, Any]],
) -> CpuShare | None:
    """The run's CpuShare from its step-clock windows, heartbeats and task_ready events; None where a figure
    is missing (a run from before tfcluster recorded the CPU count, or without the step clock)."""
    first: set[str] = set()
    demand = []
    for r in profiles:
        task = str(r.get("task"))
        if task not in first:  # the first window is warm-up (tracing)
            first.add(task)
            continue
        cpu, step = r.get("cpu_ms"), r.get("step_ms")
        if cpu is not None and step:
            demand.append(float(cpu) / float(step))
    waits = [
        float(h["host"]["wait_pct"]) / 100
        for h in heartbeats
        if isinstance(h.get("host"), Mapping) and h["host"].get("wait_pct") is not None and h["host"].get("run_ms")
    ]
    quotas = [float(h["host"]["quota_cpus"]) for h in heartbeats if (h.get("host") or {}).get("quota_cpus")]
    cpus = [int(e["cpus"]) for e in ready if e.get("cpus")]
    d, w = _median(demand), _median(waits)
    if d is None or not cpus:
        return None
    cores = float(min(cpus))
    quota = min(quotas) if quotas and min(quotas) < cores else None
    return CpuShare(d, w or 0.0, cores, layout_of(ready)[1], quota)


def layout_of(ready: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(machines, the most workers on one of them) of a run, from its task_ready events."""
    by_machine: dict[str, int] = {}
    for m in machines_of(ready).values():
        by_machine[m] = by_machine.get(m, 0) + 1
    return max(1, len(by_machine)), max(by_machine.values(), default=1)


def per_machine_at(n: int, layouts: Mapping[int, tuple[int, int]]) -> int:
    """Workers per machine at ``n`` workers: as the plan of a measured size placed them; else as densely as
    the largest measured size did (a sweep that put 3 on one machine: up to 3 on each; one per machine
    when it gave each worker a machine of its own: the model's assumption, new workers bring their cores)."""
    if n in layouts:
        return layouts[n][1]
    top = max(layouts, default=0)
    return max(1, min(n, layouts[top][1])) if top else 1


def contention_line(share: CpuShare, n: int, k: int) -> str | None:
    """The text that says own work will not stay constant at ``n`` workers (``k`` per machine), or None."""
    f = share.inflation(k)
    if f <= INFLATED:
        return None
    return (
        f"at {n} workers {k} share a machine's {share.pool(k):g} usable cores: each kept "
        f"{share.demand_cores:.2f} cores busy per step and waited for a CPU {100 * share.wait:.0f}% of its "
        f"runnable time, so own work grows x{f:.1f} (processor sharing)"
    )
