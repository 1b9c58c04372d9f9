"""A slow host's own evidence, read cheaply from /proc and /sys once per heartbeat (standard library).

A worker starved of CPU stalls inside the ring all-reduce and after it, where the step clock's
pre-all-reduce signal cannot see it. Its host can: per interval since the previous sample,

- ``wait_pct``: of the time the training process's threads were runnable, the share they waited for
  a CPU (run-queue delay, ``/proc/PID/task/*/schedstat``: run time, wait time). A CPU quota, a noisy
  neighbour or an oversubscribed host all show here — throttled time counts as waiting;
- ``throttled_pct`` / ``quota_cpus``: the CPU cgroup's throttled time per wall time and its quota
  (v2 ``cpu.stat`` ``throttled_usec`` + ``cpu.max``; v1 ``cpu.stat`` ``throttled_time`` +
  ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), the process's cgroup and its ancestors;
- ``steal_pct``: CPU time the hypervisor gave to others (``/proc/stat``);
- ``cpu_mhz`` / ``cpu_max_mhz``: the current and maximum frequency of the CPUs the process may run on;
- ``tcp_retrans_pct``: retransmitted TCP segments per segment sent (``/proc/net/snmp``, this network
  namespace) and ``net_errors``: NIC errors + drops (``/proc/net/dev``), for a degraded link.

Anything unreadable (no cgroup mount in this namespace, no cpufreq on a VM) is left out.
"""

from __future__ import annotations

import os
import time
from typing import Any

MAX_THREADS = 512  # threads of the training process sampled per heartbeat
MAX_CPUS = 64  # CPUs whose frequency is read
MAX_ANCESTORS = 4  # cgroup levels checked for throttling
# Fewer new segments than this in an interval and the retransmission ratio is noise (3 resent of 20
# is 15 %), and when the peers are gone a socket resends more than it sends anew (200 % was seen):
# below it the ratio is left out, above it capped at 100 %.
MIN_TCP_SEGMENTS = 100


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_small(path: str) -> bytes:
    """A small /proc file with raw syscalls (a third of ``open().read()``'s cost; one per thread)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 256)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _keyed(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class CgroupCpu:
    """The CPU controller directories of a process's cgroup and its ancestors (v1 or v2)."""

    def __init__(self, proc: str = "/proc", mountinfo: str | None = None) -> None:
        self.proc = proc
        self.mounts = self._mounts(mountinfo if mountinfo is not None else _read(f"{proc}/self/mountinfo"))

    @staticmethod
    def _mounts(text: str | None) -> dict[str, tuple[str, str]]:
        """{"v2" | "v1": (root inside the hierarchy, mount point)} for the cgroup2 / cpu mounts."""
        out: dict[str, tuple[str, str]] = {}
        for line in (text or "").splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            fstype, options = tail[0], tail[2].split(",")
            if fstype == "cgroup2":
                out.setdefault("v2", (fields[3], fields[4]))
            elif fstype == "cgroup" and "cpu" in options:
                out.setdefault("v1", (fields[3], fields[4]))
        return out

    def dirs(self, pid: int) -> tuple[str, list[str]]:
        """(version, [the process's cgroup directory, then its ancestors]) — empty when not mounted here."""
        text = _read(f"{self.proc}/{pid}/cgroup") or ""
        for version in ("v1", "v2"):
            mount = self.mounts.get(version)
            if mount is None:
                continue
            for line in text.splitlines():
                hid, _, rest = line.partition(":")
                controllers, _, path = rest.partition(":")
                if (version == "v2" and hid == "0" and controllers == "") or (
                    version == "v1" and "cpu" in controllers.split(",")
                ):
                    root, point = mount
                    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
                    parts = [p for p in rel.split("/") if p]
                    chain = [os.path.join(point, *parts[: len(parts) - k]) for k in range(len(parts) + 1)]
                    return version, chain[: MAX_ANCESTORS + 1]
        return "", []

    @staticmethod
    def read(version: str, d: str) -> tuple[float | None, int, int, float | None]:
        """(throttled seconds, periods, throttled periods, quota in CPUs) of one cgroup directory."""
        stat = _keyed(_read(os.path.join(d, "cpu.stat")))
        if version == "v2":
            throttled = stat.get("throttled_usec")
            seconds = throttled / 1e6 if throttled is not None else None
            quota = None
            raw = (_read(os.path.join(d, "cpu.max")) or "").split()
            if len(raw) == 2 and raw[0] != "max" and raw[1].isdigit() and int(raw[1]) > 0:
                quota = int(raw[0]) / int(raw[1])
        else:
            throttled = stat.get("throttled_time")
            seconds = throttled / 1e9 if throttled is not None else None
            q = (_read(os.path.join(d, "cpu.cfs_quota_us")) or "").strip()
            period = (_read(os.path.join(d, "cpu.cfs_period_us")) or "").strip()
            quota = int(q) / int(period) if q.lstrip("-").isdigit() and int(q) > 0 and period.isdigit() else None
        return seconds, stat.get("nr_periods", 0), stat.get("nr_throttled", 0), quota


class HostSampler:
    """Per-interval host evidence for one process (see the module docstring). ``sample()`` never raises;
    the first call only sets the baselines (its rates are left out)."""

    def __init__(self, pid: int, proc: str = "/proc", sys: str = "/sys", clock: Any = time.monotonic) -> None:
        self.pid = pid
        self.proc, self.sys = proc, sys
        self._clock = clock
        self._cgroup = CgroupCpu(proc)
        self._threads: dict[str, tuple[int, int]] = {}
        self._prev: dict[str, Any] | None = None
        self._max_mhz: float | None = None

    def sample(self) -> dict[str, Any]:
        try:
            now = self._read_all()
        except Exception:
            return {}
        prev, self._prev = self._prev, now
        if prev is None:
            return {}
        dt = now["t"] - prev["t"]
        if dt <= 0:
            return {}
        out: dict[str, Any] = {"interval_s": round(dt, 3), "threads": now["threads"]}
        run, wait = now["run_delta"], now["wait_delta"]
        out["run_ms"] = round(run / 1e6, 1)
        out["wait_ms"] = round(wait / 1e6, 1)
        if run + wait > 0:
            out["wait_pct"] = round(100.0 * wait / (run + wait), 1)
        cg_now, cg_prev = now.get("cgroup"), prev.get("cgroup")
        if cg_now is not None:
            out["quota_cpus"] = cg_now["quota"]
            if cg_prev is not None and cg_now["dirs"] == cg_prev["dirs"]:
                throttled = max(0.0, cg_now["throttled"] - cg_prev["throttled"])
                out["throttled_pct"] = round(min(100.0, 100.0 * throttled / dt), 1)
                periods = cg_now["periods"] - cg_prev["periods"]
                if periods > 0:
                    out["throttled_periods_pct"] = round(
                        100.0 * (cg_now["nr_throttled"] - cg_prev["nr_throttled"]) / periods, 1
                    )
        if now.get("cpu") and prev.get("cpu"):
            total = now["cpu"][0] - prev["cpu"][0]
            if total > 0:
                out["steal_pct"] = round(100.0 * (now["cpu"][1] - prev["cpu"][1]) / total, 1)
        if now.get("tcp") and prev.get("tcp"):
            sent = now["tcp"][0] - prev["tcp"][0]
            if sent >= MIN_TCP_SEGMENTS:
                resent = max(0, now["tcp"][1] - prev["tcp"][1])
                out["tcp_retrans_pct"] = round(min(100.0, 100.0 * resent / sent), 2)
        if now.get("net") is not None and prev.get("net") is not None:
            out["net_errors"] = max(0, now["net"] - prev["net"])
        if now.get("mhz"):
            out["cpu_mhz"] = now["mhz"]
            if self._max_mhz:
                out["cpu_max_mhz"] = self._max_mhz
        return {k: v for k, v in out.items() if v is not None}

    # --- readers ---------------------------------------------------------------------------

    def _read_all(self) -> dict[str, Any]:
        run_delta, wait_delta, threads = self._schedstat()
        return {
            "t": self._clock(),
            "run_delta": run_delta,
            "wait_delta": wait_delta,
            "threads": threads,
            "cgroup": self._cgroup_now(),
            "cpu": self._steal(),
            "tcp": self._tcp(),
            "net": self._net(),
            "mhz": self._mhz(),
        }

    def _schedstat(self) -> tuple[int, int, int]:
        """Run and run-queue wait nanoseconds of the process's threads since the last call."""
        base = f"{self.proc}/{self.pid}/task"
        try:
            tids = os.listdir(base)[:MAX_THREADS]
        except OSError:
            return 0, 0, 0
        run = wait = 0
        seen: dict[str, tuple[int, int]] = {}
        for tid in tids:
            parts = _read_small(f"{base}/{tid}/schedstat").split()
            if len(parts) < 2:
                continue
            r, w = int(parts[0]), int(parts[1])
            seen[tid] = (r, w)
            r0, w0 = self._threads.get(tid, (0, 0) if self._threads else (r, w))
            run += max(0, r - r0)
            wait += max(0, w - w0)
        self._threads = seen
        return run, wait, len(seen)

    def _cgroup_now(self) -> dict[str, Any] | None:
        version, dirs = self._cgroup.dirs(self.pid)
        if not dirs:
            return None
        best: dict[str, Any] | None = None
        quota = None
        for d in dirs:
            seconds, periods, nr_throttled, q = self._cgroup.read(version, d)
            if q is not None:
                quota = q if quota is None else min(quota, q)
            if seconds is None:
                continue
            if best is None or seconds > best["throttled"]:  # the level that throttles most
                best = {"throttled": seconds, "periods": periods, "nr_throttled": nr_throttled, "dir": d}
        if best is None:
            return None
        return {**best, "quota": round(quota, 3) if quota is not None else None, "dirs": tuple(dirs)}

    def _steal(self) -> tuple[int, int] | None:
        line = (_read(f"{self.proc}/stat") or "").split("\n", 1)[0].split()
        if len(line) < 9 or line[0] != "cpu":
            return None
        values = [int(x) for x in line[1:11] if x.isdigit()]
        return sum(values[:8]), values[7]  # (total without guest time, steal)

    def _tcp(self) -> tuple[int, int] | None:
        rows = [line.split() for line in (_read(f"{self.proc}/net/snmp") or "").splitlines() if line.startswith("Tcp:")]
        if len(rows) < 2:
            return None
        fields = dict(zip(rows[0][1:], rows[1][1:], strict=False))
        try:
            return int(fields["OutSegs"]), int(fields["RetransSegs"])
        except (KeyError, ValueError):
            return None

    def _net(self) -> int | None:
        text = _read(f"{self.proc}/net/dev")
        if text is None:
            return None
        total = 0
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            cols = rest.split()
            if name.strip() == "lo" or len(cols) < 12:
                continue
            total += int(cols[2]) + int(cols[3]) + int(cols[10]) + int(cols[11])  # rx errs, drop, tx errs, drop
        return total

    def _mhz(self) -> float | None:
        try:
            cpus = sorted(os.sched_getaffinity(self.pid))[:MAX_CPUS]
        except OSError:
            return None
        cur, peak = [], []
        for c in cpus:
            freq = (_read(f"{self.sys}/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq") or "").strip()
            if not freq.isdigit():
                return None  # no cpufreq (a VM): nothing to say
            cur.append(int(freq) / 1000.0)
            if self._max_mhz is None:
                top = (_read(f"{self.sys}/devices/system/cpu/cpu{c}/cpufreq/cpuinfo_max_freq") or "").strip()
                if top.isdigit():
                    peak.append(int(top) / 1000.0)
        if peak:
            self._max_mhz = round(max(peak), 0)
        return round(sum(cur) / len(cur), 0) if cur else None
