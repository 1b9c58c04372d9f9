"""The node's GPUs through NVML (``pynvml`` from nvidia-ml-py): inventory for preflight, and per
heartbeat the evidence of a slow GPU — SM clock against its maximum, the clock-event reasons
(power cap, thermal, HW slowdown ...), temperature, power against the enforced and the board's default
power limit, memory, PCIe/NVLink links, ECC and XID errors, and the compute processes of other
programs on it. Every reading is optional: a query the GPU or driver does not support is left out.

Cost matters (1.95 ms per sample of one H100, measured): what cannot change during a job (the
board's default power limit) is read once, what rarely changes (the enforced limit, link maxima,
NVLink states) every ``SLOW_EVERY`` samples, the process list every ``PROCS_EVERY`` samples.

No driver, no ``pynvml``, or a failing ``nvmlInit`` is not an error: no GPUs. Standard library only
otherwise; ``pynvml`` is imported lazily (and can be replaced by a fake module in tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: NVML clock-event (throttle) reason bits → names (nvml.h, nvmlClocksEventReason*).
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "thermal (SW)",
    0x40: "thermal (HW)",
    0x80: "power brake",
    0x100: "display clocks",
}
SLOW_EVERY = 30  # samples between re-reading what rarely changes (power limit, max link speed, NVLink state)
PROCS_EVERY = 5  # samples between reading the GPUs' process lists (and placing each PID)
MAX_PROCS = 32  # other processes reported per GPU
MAX_XID_EVENTS = 32  # per sample


#: ``owner(pid)``: "task" (the task's own process tree), "other" (a process outside it), "elsewhere"
#: (not in this PID namespace: a container's view of the host's PIDs), "gone" (exited meanwhile),
#: each with the process's name when readable (``worker_entry.agent.gpuowner.TaskTree``).
Owner = Callable[[int], tuple[str, "str | None"]]


def reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class Nvml:
    """NVML if a driver is there; otherwise an empty GPU list, checked once."""

    def __init__(self, module: Any = None, check_driver: bool = True) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._sampled: set[int] | None = None  # the task's GPUs (``restrict``); None: every GPU
        self._events: Any = None
        self._slow: dict[int, dict[str, Any]] = {}
        self._static: dict[int, dict[str, Any]] = {}
        self._procs: dict[int, dict[str, Any]] = {}
        self._xid: dict[int, tuple[int, int | None]] = {}  # index -> (count, last xid)
        self._n = 0
        no_driver = not os.path.exists("/dev/nvidiactl") and not os.environ.get("NVIDIA_VISIBLE_DEVICES")
        if module is None and check_driver and no_driver:
            return  # no NVIDIA driver here: skip importing pynvml and a failing nvmlInit
        try:
            if module is None:
                import pynvml as module  # type: ignore[no-redef]

            module.nvmlInit()
            self._nvml = module
            self._handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]
        except Exception:
            self._nvml = None
            return
        self._register_xid()

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _get(self, fn: str, *args: Any) -> Any:
        """One NVML query; None when unsupported or failing."""
        try:
            return getattr(self._nvml, fn)(*args)
        except Exception:
            return None

    def restrict(self, visible: str | None) -> None:
        """Sample only the task's GPUs: ``CUDA_VISIBLE_DEVICES`` as indices or UUIDs (``GPU-...``).
        A node with several tasks (Slurm's share per task) would otherwise judge each task by its
        neighbour's GPUs and processes. Indices are NVML's (PCI bus order): right when CUDA enumerates
        in that order too (``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default, fastest first, ties in bus order,
        is the same order on a node of one model).
        Unset or unrecognised (MIG instances): every GPU; empty, ``-1`` or Slurm's ``NoDevFiles``: none."""
        if visible is None or self._nvml is None:
            return
        items = [x.strip() for x in visible.split(",") if x.strip()]
        if not items or items[0] in ("-1", "NoDevFiles"):
            self._sampled = set()
            return
        chosen: set[int] = set()
        for item in items:
            if item.isdigit():
                chosen.add(int(item))
                continue
            for i, h in enumerate(self._handles):
                uuid = self._get("nvmlDeviceGetUUID", h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                if isinstance(uuid, str) and item.startswith("GPU-") and uuid.startswith(item):
                    chosen.add(i)
        if chosen:
            self._sampled = chosen

    def inventory(self) -> list[dict[str, Any]]:
        out = []
        for i, h in enumerate(self._handles):
            name = self._get("nvmlDeviceGetName", h)
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            if name is None or mem is None:
                continue
            out.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_mb": int(mem.total // (1024 * 1024)),
                }
            )
        return out

    def utilization(self) -> list[dict[str, Any]]:
        """The short form: utilisation and memory (kept for callers that want only that)."""
        return [{k: g[k] for k in ("index", "util", "mem_used_mb") if k in g} for g in self.sample()]

    def sample(self, owner: Owner | None = None) -> list[dict[str, Any]]:
        """Per GPU, everything readable now (see the module docstring). Never raises. With ``owner``
        (the task's process tree), the processes outside it that use each GPU (``others``)."""
        if self._nvml is None:
            return []
        self._n += 1
        xids = self._poll_xid()
        out = []
        for i, h in enumerate(self._handles):
            if self._sampled is not None and i not in self._sampled:
                continue
            try:
                g = self._one(i, h, xids.get(i))
                if owner is not None:
                    g.update(self._processes(i, h, owner))
                out.append(g)
            except Exception:
                continue
        return out

    def _processes(self, i: int, h: Any, owner: Owner) -> dict[str, Any]:
        """How many compute processes use the GPU, and those not of the task: re-read every
        PROCS_EVERY samples (a leftover process of an earlier job stays for minutes)."""
        cached = self._procs.get(i)
        if cached is not None and self._n % PROCS_EVERY != 1:
            return cached
        procs = self._get("nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None:
            self._procs[i] = {}
            return {}
        others = []
        for proc in procs:
            pid = int(getattr(proc, "pid", 0) or 0)
            where, name = owner(pid)
            if where in ("task", "gone") or len(others) >= MAX_PROCS:
                continue
            used = getattr(proc, "usedGpuMemory", None)  # bytes; None when the driver cannot tell
            entry: dict[str, Any] = {"pid": pid, "visible": where != "elsewhere"}
            if isinstance(used, int) and 0 <= used < 1 << 50:
                entry["used_mb"] = used // (1024 * 1024)
            if name:
                entry["name"] = name[:64]
            others.append(entry)
        self._procs[i] = {"processes": min(len(procs), 4096), "others": others}
        return self._procs[i]

    def _one(self, i: int, h: Any, xid: tuple[int, int | None] | None) -> dict[str, Any]:
        n = self._nvml
        g: dict[str, Any] = {"index": i}
        util = self._get("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            g["util"] = util.gpu
        mem = self._get("nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            g["mem_used_mb"] = int(mem.used // (1024 * 1024))
            g["mem_total_mb"] = int(mem.total // (1024 * 1024))
        sm = getattr(n, "NVML_CLOCK_SM", 1)
        g["sm_clock_mhz"] = self._get("nvmlDeviceGetClockInfo", h, sm)
        g["sm_clock_max_mhz"] = self._get("nvmlDeviceGetMaxClockInfo", h, sm)
        mask = self._get("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:
            mask = self._get("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if mask is not None:
            g["throttle"] = reasons(int(mask))
        g["temp_c"] = self._get("nvmlDeviceGetTemperature", h, getattr(n, "NVML_TEMPERATURE_GPU", 0))
        power = self._get("nvmlDeviceGetPowerUsage", h)
        g["power_w"] = round(power / 1000.0, 1) if power is not None else None
        g.update(self._static_fields(i, h))
        g["pcie_gen"] = self._get("nvmlDeviceGetCurrPcieLinkGeneration", h)
        g["pcie_width"] = self._get("nvmlDeviceGetCurrPcieLinkWidth", h)
        g.update(self._slow_fields(i, h))
        ecc = self._get(
            "nvmlDeviceGetTotalEccErrors",
            h,
            getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(n, "NVML_VOLATILE_ECC", 0),
        )
        g["ecc_uncorrected"] = int(ecc) if ecc is not None else None
        if xid is not None:
            g["xid_errors"], g["last_xid"] = xid
        return {k: v for k, v in g.items() if v is not None}

    def _static_fields(self, i: int, h: Any) -> dict[str, Any]:
        """The board's default power limit: a property of the board, read once."""
        if i not in self._static:
            default = self._get("nvmlDeviceGetPowerManagementDefaultLimit", h)
            self._static[i] = {} if default is None else {"power_default_limit_w": round(default / 1000.0, 1)}
        return self._static[i]

    def _slow_fields(self, i: int, h: Any) -> dict[str, Any]:
        """The enforced power limit (an administrator may change it), maximum link generation/width
        and active NVLinks: read every SLOW_EVERY samples."""
        cached = self._slow.get(i)
        if cached is not None and self._n % SLOW_EVERY != 1:
            return cached
        limit = self._get("nvmlDeviceGetEnforcedPowerLimit", h)
        out: dict[str, Any] = {
            "power_limit_w": round(limit / 1000.0, 1) if limit is not None else None,
            "pcie_gen_max": self._get("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_width_max": self._get("nvmlDeviceGetMaxPcieLinkWidth", h),
        }
        links = getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18)
        active = 0
        readable = False
        for link in range(int(links)):
            state = self._get("nvmlDeviceGetNvLinkState", h, link)
            if state is None:
                break
            readable = True
            active += 1 if state else 0
        out["nvlink_active"] = active if readable else None
        self._slow[i] = {k: v for k, v in out.items() if v is not None}
        return self._slow[i]

    def _register_xid(self) -> None:
        kind = getattr(self._nvml, "nvmlEventTypeXidCriticalError", None)
        if kind is None:
            return
        try:
            events = self._nvml.nvmlEventSetCreate()
            for h in self._handles:
                try:
                    self._nvml.nvmlDeviceRegisterEvents(h, kind, events)
                except Exception:
                    continue
            self._events = events
        except Exception:
            self._events = None

    def _poll_xid(self) -> dict[int, tuple[int, int | None]]:
        """Critical XID events since the last sample (non-blocking), counted per GPU."""
        if self._events is not None:
            wait: Callable[..., Any] | None = getattr(self._nvml, "nvmlEventSetWait_v2", None) or getattr(
                self._nvml, "nvmlEventSetWait", None
            )
            for _ in range(MAX_XID_EVENTS):
                try:
                    data = wait(self._events, 0) if wait else None
                except Exception:
                    break  # NVML_ERROR_TIMEOUT: nothing pending
                if data is None:
                    break
                index = self._index_of(getattr(data, "device", None))
                count, _ = self._xid.get(index, (0, None))
                self._xid[index] = (count + 1, int(getattr(data, "eventData", 0)))
        return dict(self._xid)

    def _index_of(self, handle: Any) -> int:
        for i, h in enumerate(self._handles):
            if h == handle:
                return i
        return 0

    def close(self) -> None:
        if self._nvml is not None and self._events is not None:
            self._get("nvmlEventSetFree", self._events)
