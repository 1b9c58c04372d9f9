"""The TensorBoard tags of what tfcluster measures per task: the record fields each is read from
(``sinks.tensorboard`` writes them; split from it to keep that module one responsibility under the cap)."""

from __future__ import annotations

#: step-clock window fields -> tags (milliseconds per step)
SPLIT_TAGS = {
    "step_ms": "step_split/step_ms",
    "input_ms": "step_split/input_ms",
    "compute_ms": "step_split/compute_ms",
    "collective_ms": "step_split/collective_ms",
    "update_ms": "step_split/update_ms",
    "host_ms": "step_split/host_ms",
    "other_ms": "step_split/other_ms",
    "pre_collective_ms": "step_split/own_work_ms",
    "cpu_ms": "step_split/cpu_ms",
}
HOST_TAGS = {
    "wait_pct": "host/run_queue_wait_pct",
    "throttled_pct": "host/cpu_throttled_pct",
    "steal_pct": "host/cpu_steal_pct",
    "tcp_retrans_pct": "host/tcp_retrans_pct",
}
GPU_TAGS = {
    "util": "util_pct",
    "sm_clock_mhz": "sm_clock_mhz",
    "power_w": "power_w",
    "temp_c": "temp_c",
    "mem_used_mb": "mem_used_mb",
}
