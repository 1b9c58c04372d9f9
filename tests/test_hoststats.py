"""A slow host's evidence (hoststats) and a slow GPU's (nvml): fake /proc and /sys trees, a fake pynvml
module, a real CPU quota on a real process (when a cgroup is writable), and the heartbeat carrying it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from waiting import wait_for

from worker_entry import protocol as p
from worker_entry.agent.gpuowner import TaskTree
from worker_entry.agent.hoststats import CgroupCpu, HostSampler
from worker_entry.agent.nvml import PROCS_EVERY, Nvml, reasons

# ------------------------------------------------------------------------------------- fake /proc


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_host(tmp: Path, *, v: int, pid: int = 4242) -> tuple[Path, Path]:
    proc, cg = tmp / "proc", tmp / "cg"
    if v == 1:
        write(proc / "self" / "mountinfo", f"30 25 0:26 / {cg} rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
        write(proc / str(pid) / "cgroup", "4:memory:/x\n2:cpu,cpuacct:/job/worker1\n")
    else:
        write(proc / "self" / "mountinfo", f"30 25 0:26 / {cg} rw,nosuid - cgroup2 cgroup2 rw\n")
        write(proc / str(pid) / "cgroup", "0::/job/worker1\n")
    return proc, cg


def set_threads(proc: Path, pid: int, threads: dict[int, tuple[int, int]]) -> None:
    for tid, (run, wait) in threads.items():
        write(proc / str(pid) / "task" / str(tid) / "schedstat", f"{run} {wait} 7\n")


def set_counters(proc: Path, steal: int, total: int, out_segs: int, retrans: int, errs: int) -> None:
    user = total - steal
    write(proc / "stat", f"cpu  {user} 0 0 0 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")
    write(
        proc / "net" / "snmp",
        f"Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 {out_segs} {retrans}\n",
    )
    head = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop\n"
    write(
        proc / "net" / "dev",
        head + f"    lo: 1 2 9 9 0 0 0 0 1 2 9 9 0 0 0 0\n  eth0: 1 2 {errs} 0 0 0 0 0 1 2 0 0 0 0 0 0\n",
    )


@pytest.mark.parametrize("version", [1, 2])
def test_host_sample_from_proc_and_cgroup(tmp_path, monkeypatch, version):
    pid = 4242
    proc, cg = fake_host(tmp_path, v=version)
    d = cg / "job" / "worker1"
    if version == 1:
        write(d / "cpu.stat", "nr_periods 10\nnr_throttled 0\nthrottled_time 0\n")
        write(d / "cpu.cfs_quota_us", "20000\n")
        write(d / "cpu.cfs_period_us", "100000\n")
    else:
        write(d / "cpu.stat", "usage_usec 1\nnr_periods 10\nnr_throttled 0\nthrottled_usec 0\n")
        write(d / "cpu.max", "20000 100000\n")
    write(cg / "job" / "cpu.stat", "nr_periods 0\nnr_throttled 0\n")
    set_threads(proc, pid, {pid: (1_000_000_000, 0), pid + 1: (0, 0)})
    set_counters(proc, steal=0, total=1000, out_segs=1000, retrans=0, errs=0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    clock = Clock()
    h = HostSampler(pid, proc=str(proc), sys=str(tmp_path / "sys"), clock=clock)
    assert h.sample() == {}  # baselines only
    # one second later: thread 1 ran 0.2 s and waited 0.6 s; a new thread ran 0.1 s, waited 0.1 s;
    # the cgroup was throttled for 0.7 s in 9 of 10 periods; 5 % steal; 3 of 100 segments resent
    clock.t += 1.0
    import shutil

    shutil.rmtree(proc / str(pid) / "task" / str(pid + 1))  # a thread ended
    set_threads(proc, pid, {pid: (1_200_000_000, 600_000_000), pid + 2: (100_000_000, 100_000_000)})
    if version == 1:
        write(d / "cpu.stat", "nr_periods 20\nnr_throttled 9\nthrottled_time 700000000\n")
    else:
        write(d / "cpu.stat", "nr_periods 20\nnr_throttled 9\nthrottled_usec 700000\n")
    set_counters(proc, steal=5, total=1100, out_segs=1100, retrans=3, errs=4)
    s = h.sample()
    assert s["run_ms"] == 300.0 and s["wait_ms"] == 700.0 and s["wait_pct"] == 70.0 and s["threads"] == 2
    assert s["throttled_pct"] == 70.0 and s["throttled_periods_pct"] == 90.0 and s["quota_cpus"] == 0.2
    assert s["steal_pct"] == 5.0 and s["tcp_retrans_pct"] == 3.0 and s["net_errors"] == 4
    assert "cpu_mhz" not in s  # no cpufreq here (a VM): left out
    p.HostSample.from_dict(s)  # a valid protocol record
    # peers gone: the sockets resend more than they send anew (capped); too few segments: left out
    clock.t += 1.0
    set_counters(proc, steal=5, total=1200, out_segs=1200, retrans=303, errs=4)
    assert h.sample()["tcp_retrans_pct"] == 100.0
    clock.t += 1.0
    set_counters(proc, steal=5, total=1300, out_segs=1210, retrans=305, errs=4)
    assert "tcp_retrans_pct" not in h.sample()


def test_cgroup_paths_v1_root_and_missing_mounts(tmp_path):
    proc, cg = fake_host(tmp_path, v=1)
    version, dirs = CgroupCpu(str(proc)).dirs(4242)
    assert version == "v1" and dirs == [str(cg / "job" / "worker1"), str(cg / "job"), str(cg)]
    # inside `ip netns exec` /sys is remounted: no cgroup mount, nothing to read (schedstat still works)
    assert CgroupCpu(str(proc), mountinfo="").dirs(4242) == ("", [])


def test_cpu_frequency_when_cpufreq_exists(tmp_path, monkeypatch):
    sysdir = tmp_path / "sys"
    for c, cur in ((0, 1_100_000), (1, 1_300_000)):
        write(sysdir / f"devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq", f"{cur}\n")
        write(sysdir / f"devices/system/cpu/cpu{c}/cpufreq/cpuinfo_max_freq", "3000000\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    proc, _ = fake_host(tmp_path, v=2)
    clock = Clock()
    h = HostSampler(4242, proc=str(proc), sys=str(sysdir), clock=clock)
    h.sample()
    clock.t += 1
    s = h.sample()
    assert s["cpu_mhz"] == 1200.0 and s["cpu_max_mhz"] == 3000.0


def _writable_cpu_cgroup() -> tuple[str, str] | None:
    """(version, parent directory) of a CPU cgroup we may create children in, else None."""
    for version, d in (("v1", "/sys/fs/cgroup/cpu"), ("v2", "/sys/fs/cgroup")):
        marker = "cpu.cfs_quota_us" if version == "v1" else "cgroup.subtree_control"
        if os.path.exists(os.path.join(d, marker)) and os.access(d, os.W_OK):
            if version == "v2" and "cpu" not in Path(d, "cgroup.controllers").read_text().split():
                continue
            return version, d
    return None


def test_real_cpu_quota_shows_as_throttling_and_run_queue_delay(tmp_path):
    """A real busy process, moved into a cgroup with a 0.1 CPU quota: its threads' run-queue delay and
    the cgroup's throttled time jump (cgroup v1 cpu.cfs_quota_us or v2 cpu.max, whichever is here).
    On a loaded machine the process may not even get its quota in every period, so the sampler is read
    until a window shows the throttling (bounded), and that window is the one asserted on."""
    found = _writable_cpu_cgroup()
    if found is None:
        pytest.skip("no writable CPU cgroup (v1 cpu controller or v2 with cpu) on this machine")
    version, parent = found
    cg = os.path.join(parent, f"tfcluster-test-{os.getpid()}")
    os.mkdir(cg)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        if version == "v1":
            Path(cg, "cpu.cfs_period_us").write_text("100000")
            Path(cg, "cpu.cfs_quota_us").write_text("10000")
        else:
            Path(cg, "cpu.max").write_text("10000 100000")
        h = HostSampler(busy.pid)
        h.sample()
        time.sleep(0.6)
        free = h.sample()
        Path(cg, "cgroup.procs").write_text(str(busy.pid))
        h.sample()

        def window() -> dict | None:
            """The next 0.8 s sampling window, when it shows the throttling."""
            time.sleep(0.8)
            sample = h.sample()
            return sample if _starved(sample) else None

        starved = wait_for(window, 15, "a sampling window that shows the quota holding the process back", interval=0)
    finally:
        busy.kill()
        busy.wait()
        for _ in range(50):  # the cgroup is removable once its last task is gone
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.05)
    assert not os.path.exists(cg)
    assert starved["quota_cpus"] == pytest.approx(0.1) and starved["throttled_pct"] > 40, starved
    # the quota is what throttles it: nothing throttled it before (its run-queue delay before depends on
    # how busy this machine is, so it is not compared); under 0.1 CPU it waits most of its runnable time
    assert not free.get("throttled_pct"), free
    assert starved["wait_pct"] > 60, (free, starved)


def _starved(sample: dict) -> bool:
    """A window in which the quota held the process back: what the test above asserts."""
    return (sample.get("throttled_pct") or 0) > 40 and (sample.get("wait_pct") or 0) > 60


# -------------------------------------------------------------------------------------- fake NVML


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], *, xid: list[tuple[int, int]] | None = None) -> types.ModuleType:
    """A pynvml stand-in: ``gpus`` give each device's readings; a missing key raises NVMLError (an
    unsupported query), like the real library."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU = 1, 0
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC = 1, 0
    m.NVML_NVLINK_MAX_LINKS = 4
    m.nvmlEventTypeXidCriticalError = 8
    m.NVMLError = NVMLError
    pending = list(xid or [])

    def q(key):
        def get(h, *args):
            value = gpus[h].get(key)
            if value is None:
                raise NVMLError("not supported")
            return value(*args) if callable(value) else value

        return get

    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = q("name")
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=gpus[h]["mem_total"], used=gpus[h]["mem_used"])
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=gpus[h]["util"], memory=0)
    m.nvmlDeviceGetClockInfo = q("sm")
    m.nvmlDeviceGetMaxClockInfo = q("sm_max")
    m.nvmlDeviceGetCurrentClocksEventReasons = q("reasons")
    m.nvmlDeviceGetTemperature = q("temp")
    m.nvmlDeviceGetPowerUsage = q("power_mw")
    m.nvmlDeviceGetEnforcedPowerLimit = q("limit_mw")
    m.nvmlDeviceGetPowerManagementDefaultLimit = q("default_mw")
    m.nvmlDeviceGetComputeRunningProcesses = q("procs")
    m.nvmlDeviceGetUUID = q("uuid")
    m.nvmlDeviceGetCurrPcieLinkGeneration = q("gen")
    m.nvmlDeviceGetMaxPcieLinkGeneration = q("gen_max")
    m.nvmlDeviceGetCurrPcieLinkWidth = q("width")
    m.nvmlDeviceGetMaxPcieLinkWidth = q("width_max")
    m.nvmlDeviceGetNvLinkState = q("nvlink")
    m.nvmlDeviceGetTotalEccErrors = q("ecc")
    m.nvmlEventSetCreate = lambda: "events"
    m.nvmlDeviceRegisterEvents = lambda h, kind, events: None

    def wait(events, timeout_ms):
        if not pending:
            raise NVMLError("timeout")
        device, code = pending.pop(0)
        return types.SimpleNamespace(device=device, eventData=code, eventType=8)

    m.nvmlEventSetWait_v2 = wait
    return m


GIB = 1 << 30


def test_nvml_sample_reads_clocks_throttle_reasons_links_and_errors():
    throttled = {
        "name": b"NVIDIA H100 80GB HBM3",
        "mem_total": 80 * GIB,
        "mem_used": 70 * GIB,
        "util": 99,
        "sm": 1100,
        "sm_max": 1980,
        "reasons": 0x4 | 0x20,  # power cap + thermal (SW)
        "temp": 87,
        "power_mw": 699_000,
        "limit_mw": 700_000,
        "gen": 4,
        "gen_max": 5,
        "width": 8,
        "width_max": 16,
        "nvlink": lambda link: link < 3,
        "ecc": 2,
    }
    plain = {"name": "Tesla T4", "mem_total": 16 * GIB, "mem_used": GIB, "util": 10}  # many queries unsupported
    nv = Nvml(module=fake_pynvml([throttled, plain], xid=[(0, 79)]))
    assert nv.available
    assert nv.inventory() == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81920},
        {"index": 1, "name": "Tesla T4", "memory_mb": 16384},
    ]
    g0, g1 = nv.sample()
    assert g0["sm_clock_mhz"] == 1100 and g0["sm_clock_max_mhz"] == 1980
    assert g0["throttle"] == ["power cap", "thermal (SW)"] and g0["temp_c"] == 87
    assert g0["power_w"] == 699.0 and g0["power_limit_w"] == 700.0 and g0["mem_used_mb"] == 70 * 1024
    assert (g0["pcie_gen"], g0["pcie_gen_max"], g0["pcie_width"], g0["pcie_width_max"]) == (4, 5, 8, 16)
    assert g0["nvlink_active"] == 3 and g0["ecc_uncorrected"] == 2
    assert g0["xid_errors"] == 1 and g0["last_xid"] == 79
    assert g1 == {"index": 1, "util": 10, "mem_used_mb": 1024, "mem_total_mb": 16384}  # unsupported: absent
    for g in (g0, g1):
        p.GpuSample.from_dict(g)  # valid heartbeat records
    assert nv.utilization()[0] == {"index": 0, "util": 99, "mem_used_mb": 70 * 1024}
    assert nv.sample()[0]["xid_errors"] == 1  # cumulative; no new event


def test_nvml_reads_the_static_limit_once_and_the_process_list_every_few_samples():
    """The board's default power limit is read once; the process list every PROCS_EVERY samples, each
    PID placed by the owner: the task's own are left out, another program's reported with its memory."""
    calls = {"default": 0, "procs": 0}
    procs = [
        types.SimpleNamespace(pid=4242, usedGpuMemory=1002 * 1024 * 1024),
        types.SimpleNamespace(pid=4711, usedGpuMemory=1002 * 1024 * 1024),
        types.SimpleNamespace(pid=9999, usedGpuMemory=None),
    ]

    def default_mw():
        calls["default"] += 1
        return 700_000

    def listed():
        calls["procs"] += 1
        return procs

    gpu = {
        "name": "H100",
        "mem_total": 80 * GIB,
        "mem_used": GIB,
        "util": 97,
        "limit_mw": 400_000,
        "default_mw": default_mw,
        "procs": listed,
    }
    owners = {4242: ("task", "python3"), 4711: ("other", "python3"), 9999: ("elsewhere", None)}
    nv = Nvml(module=fake_pynvml([gpu]))
    samples = [nv.sample(lambda pid: owners[pid])[0] for _ in range(PROCS_EVERY + 1)]
    assert calls == {"default": 1, "procs": 2}  # the first sample, then PROCS_EVERY samples later
    g = samples[-1]
    assert g["power_limit_w"] == 400.0 and g["power_default_limit_w"] == 700.0 and g["processes"] == 3
    assert g["others"] == [
        {"pid": 4711, "visible": True, "used_mb": 1002, "name": "python3"},
        {"pid": 9999, "visible": False},
    ]
    back = p.GpuSample.from_dict(g)  # a valid heartbeat record
    assert back.others[0].pid == 4711 and back.others[1].visible is False
    assert "others" not in nv.sample()[0]  # no owner (no task yet): no process list
    with pytest.raises(p.ProtocolError, match=r"others\[0\]\.pid"):
        p.GpuSample.from_dict({"index": 0, "others": [{"pid": -1}]})


def test_nvml_samples_only_the_tasks_gpus():
    """A node shared by several tasks (Slurm's share per task): each samples its CUDA_VISIBLE_DEVICES."""
    gpus = [{"name": "H100", "mem_total": GIB, "mem_used": 0, "util": 0, "uuid": f"GPU-{i}aaa"} for i in range(4)]

    def sampled(visible):
        nv = Nvml(module=fake_pynvml(gpus))
        nv.restrict(visible)
        return [g["index"] for g in nv.sample()]

    assert sampled(None) == [0, 1, 2, 3] and sampled("2,3") == [2, 3] and sampled("GPU-1aa") == [1]
    assert sampled("") == [] and sampled("NoDevFiles") == [] and sampled("MIG-xyz") == [0, 1, 2, 3]


def test_task_tree_tells_the_tasks_processes_from_another_programs(tmp_path):
    """Real processes: the training process (its own session) and a grandchild are the task's; a
    process started apart from it is another program's, named; a PID that exited is gone."""
    task = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        grandchild = int(task.stdout.readline())
        tree = TaskTree(task.pid)  # (worker_entry, its parent, is left out: here it is pytest, the parent of both)
        assert tree(task.pid) == ("task", None)
        assert tree(grandchild)[0] == "task"  # (its name: sh until it has exec'd sleep)
        assert tree(other.pid) == ("other", "sleep")
        gone = subprocess.Popen(["true"])
        gone.wait()
        assert tree(gone.pid)[0] in ("gone", "elsewhere")
        assert tree(0)[0] in ("gone", "elsewhere")
    finally:
        for proc in (task, other):
            os.killpg(proc.pid, 9)
            proc.wait()
        task.stdout.close()


def test_nvml_absent_or_broken_is_no_gpus():
    broken = types.ModuleType("pynvml")

    def fail():
        raise NVMLError("driver/library version mismatch")

    broken.nvmlInit = fail
    assert Nvml(module=broken).sample() == [] and not Nvml(module=broken).available
    assert reasons(0x1 | 0x8 | 0x40) == ["idle", "HW slowdown", "thermal (HW)"]


def test_heartbeat_with_host_and_gpu_evidence_round_trips():
    hb = p.Heartbeat(
        seq=3,
        ts=1.0,
        host=p.HostSample(interval_s=1.0, wait_pct=80.0, throttled_pct=60.0, quota_cpus=0.2),
        gpus=[p.GpuSample(index=0, sm_clock_mhz=1100, sm_clock_max_mhz=1980, throttle=["power cap"])],
    )
    back = p.parse_message(p.msg_frame(hb)[p.HEADER.size :])
    assert back.host.wait_pct == 80.0 and back.gpus[0].throttle == ["power cap"]
    with pytest.raises(p.ProtocolError, match=r"heartbeat\.host\.wait_pct"):
        p.parse_message(b'{"type": "heartbeat", "seq": 1, "host": {"wait_pct": 170}}')
