"""What a node measures about its host and GPUs, carried in every heartbeat.

Kept apart from ``messages``: these records grow with every new piece of evidence; the message set
does not."""

from __future__ import annotations

from dataclasses import dataclass, field

from .schema import COUNT_MAX, ID_MAX, MB_MAX, MS_MAX, S_MAX, Record, spec


@dataclass
class GpuSample(Record):
    """One GPU in a heartbeat (NVML; a field the GPU or driver cannot report is absent)."""

    index: int = field(metadata=spec(lo=0, hi=1024))
    util: float | None = field(default=None, metadata=spec(lo=0, hi=100))
    mem_used_mb: int | None = field(default=None, metadata=spec(lo=0, hi=MB_MAX))
    mem_total_mb: int | None = field(default=None, metadata=spec(lo=0, hi=MB_MAX))
    sm_clock_mhz: int | None = field(default=None, metadata=spec(lo=0, hi=100_000))
    sm_clock_max_mhz: int | None = field(default=None, metadata=spec(lo=0, hi=100_000))
    throttle: list[str] | None = field(default=None, metadata=spec(max_len=16))  # clock-event reasons
    temp_c: float | None = field(default=None, metadata=spec(lo=-100, hi=1000))
    power_w: float | None = field(default=None, metadata=spec(lo=0, hi=100_000))
    power_limit_w: float | None = field(default=None, metadata=spec(lo=0, hi=100_000))
    pcie_gen: int | None = field(default=None, metadata=spec(lo=0, hi=64))
    pcie_gen_max: int | None = field(default=None, metadata=spec(lo=0, hi=64))
    pcie_width: int | None = field(default=None, metadata=spec(lo=0, hi=256))
    pcie_width_max: int | None = field(default=None, metadata=spec(lo=0, hi=256))
    nvlink_active: int | None = field(default=None, metadata=spec(lo=0, hi=256))
    ecc_uncorrected: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    xid_errors: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    last_xid: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))


@dataclass
class HostSample(Record):
    """A host's evidence about the training process over the last heartbeat interval (hoststats)."""

    interval_s: float = field(default=0.0, metadata=spec(lo=0, hi=S_MAX))
    threads: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    run_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))  # CPU time of its threads
    wait_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))  # their run-queue delay
    wait_pct: float | None = field(default=None, metadata=spec(lo=0, hi=100))  # wait / (run + wait)
    throttled_pct: float | None = field(default=None, metadata=spec(lo=0, hi=100))  # cgroup throttled / wall
    throttled_periods_pct: float | None = field(default=None, metadata=spec(lo=0, hi=100))
    quota_cpus: float | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    steal_pct: float | None = field(default=None, metadata=spec(lo=0, hi=100))
    cpu_mhz: float | None = field(default=None, metadata=spec(lo=0, hi=1e7))
    cpu_max_mhz: float | None = field(default=None, metadata=spec(lo=0, hi=1e7))
    tcp_retrans_pct: float | None = field(default=None, metadata=spec(lo=0, hi=100))
    net_errors: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
