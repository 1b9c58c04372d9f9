"""What a node knows about itself: facts for preflight and resource samples for heartbeats.

Stdlib first; psutil and NVML (nvidia-ml-py, through ``nvml.Nvml``) are used when importable. No GPU
is not an error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from ..protocol.env import Env
from .nvml import Nvml


def load_psutil() -> Any:
    """psutil, or None where the node lacks it. Imported when first needed, not at start: it costs
    ~11 ms of CPU on every host before the hello, and a short task may never sample its processes."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency, but the node may lack it
        return None
    return psutil


PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf_keras", "keras", "numpy", "tfcluster")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def package_versions() -> dict[str, str | None]:
    """Versions of PACKAGES, as importlib.metadata finds them (first on sys.path wins).

    The version is read from the ``NAME-VERSION.dist-info`` (or ``.egg-info``) directory name, one
    listdir per path entry: importing importlib.metadata and parsing METADATA files costs ~30 ms
    per host start, which a 2-core box with 16 hosts pays 16 times. Only a metadata directory
    without a version in its name (a develop egg-info) is asked through importlib.metadata.
    """
    want = {_normalize(n): n for n in PACKAGES}
    out: dict[str, str | None] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for d in names:
            stem, dot, suffix = d.rpartition(".")
            if not dot or suffix not in ("dist-info", "egg-info"):
                continue
            dist, _, rest = stem.partition("-")
            key = want.get(_normalize(dist))
            if key is None or key in out:
                continue
            version = rest.split("-", 1)[0] if suffix == "egg-info" else rest
            out[key] = version or _metadata_version(key)
    return {name: out.get(name) for name in PACKAGES}


def _platform() -> str:
    """Like platform.platform() ("Linux-6.1.0-x86_64-with-glibc2.36") without its scan of the
    interpreter binary for the libc version (6 ms)."""
    u = os.uname()
    libc = ""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        libc = (os.confstr("CS_GNU_LIBC_VERSION") or "").replace("glibc ", "-with-glibc")
    return f"{u.sysname}-{u.release}-{u.machine}{libc}"


def _metadata_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except Exception:  # PackageNotFoundError, or broken metadata
        return None


def gpu_inventory(nvml: Nvml | None = None) -> list[dict[str, Any]]:
    """GPUs by NVML, else by nvidia-smi, else none."""
    nvml = nvml or Nvml()
    if nvml.available:
        return nvml.inventory()
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except Exception:
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "name": parts[1], "memory_mb": int(float(parts[2] or 0))})
    return gpus


def port_in_use(port: int) -> str | None:
    """None when a TF server could bind `port` on every address; else who holds it.

    TensorFlow's gRPC server binds `*:port` with SO_REUSEADDR, so we test the same way (a TIME_WAIT
    socket from the previous run is not a conflict, a listener is).
    """
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, addr in families:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return _listener_of(port) or ("in use" if exc.errno == errno.EADDRINUSE else "permission denied")
            if exc.errno == errno.EADDRNOTAVAIL:
                continue
        finally:
            s.close()
    return None


def _listener_of(port: int) -> str | None:
    psutil = load_psutil()
    if psutil is None:
        return None
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                if c.pid:
                    try:
                        return f"in use by pid {c.pid} ({psutil.Process(c.pid).name()})"
                    except Exception:
                        return f"in use by pid {c.pid}"
                return "in use"
    except Exception:
        return None
    return None


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_TCP_LISTEN = 10


def _listening_netlink(port: int) -> bool:
    """Ask the kernel (sock_diag) for LISTEN sockets only: a few entries, where /proc/net/tcp lists
    every connection of the namespace (milliseconds per read on a busy host)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            sockid = struct.pack("!HH", 0, 0) + bytes(32) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN) + sockid
            nl.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 0x301, 1, 0) + req)
            done = False
            while not done:
                data = nl.recv(65536)
                off = 0
                while off + 16 <= len(data):
                    length, mtype = struct.unpack_from("=IH", data, off)
                    if mtype == 3:  # NLMSG_DONE
                        done = True
                        break
                    if mtype == 2:  # NLMSG_ERROR
                        raise OSError("sock_diag error")
                    if struct.unpack_from("!H", data, off + 16 + 4)[0] == port:
                        return True
                    off += (length + 3) & ~3
                if not data:
                    break
    return False


def listening(port: int) -> bool:
    """Is anything listening on TCP `port` in this network namespace?"""
    try:
        return _listening_netlink(port)
    except (OSError, struct.error, AttributeError):
        return _listening_proc(port)


def _listening_proc(port: int) -> bool:
    want = f":{port:04X}"
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                for line in f:
                    parts = line.split(None, 4)
                    if len(parts) > 3 and parts[3] == "0A" and parts[1].endswith(want):
                        return True
        except OSError:
            continue
    return False


def free_disk(path: str) -> tuple[str, int] | None:
    """Free bytes at `path` or its nearest existing parent (the checkpoint dir may not exist yet)."""
    p = os.path.abspath(os.path.expanduser(path))
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return p, st.f_bavail * st.f_frsize


def node_facts(config: dict[str, Any], nvml: Nvml | None = None) -> dict[str, Any]:
    """Everything preflight compares across hosts, plus local problems that make starting pointless."""
    problems: list[dict[str, str]] = []  # {check, message, fix}: these stop the launch
    warnings: list[dict[str, str]] = []
    workdir = config.get("workdir")
    if workdir:
        wd = os.path.expanduser(workdir)
        if not os.path.isdir(wd):
            problems.append(
                {
                    "check": "workdir",
                    "message": f"workdir {workdir} does not exist",
                    "fix": "create it or fix job.workdir",
                }
            )
    if config.get("command"):  # the script and its interpreter, as the command will start (scriptcheck)
        from .scriptcheck import command_problems

        try:
            problems += command_problems(config["command"], workdir, config.get("env") or {})
        except Exception as exc:  # a check of ours that breaks must not stop the job: said, not blocking
            warnings.append({"check": "command", "message": f"could not check the command: {exc!r}", "fix": ""})
    tf_port = config.get("tf_port")
    if tf_port:
        holder = port_in_use(int(tf_port))
        if holder:
            problems.append(
                {
                    "check": "tf_port",
                    "message": f"TF port {tf_port} is {holder}",
                    "fix": "stop that process, or choose another tensorflow.port / hosts[].tf_port",
                }
            )
    gpus = gpu_inventory(nvml)
    want = int(config.get("gpus") or 0)
    if want > len(gpus):
        problems.append(
            {
                "check": "gpus",
                "message": f"the spec gives this task {want} GPU(s) but {len(gpus)} are visible"
                + (" (no NVIDIA driver/NVML found)" if not gpus else ""),
                "fix": "fix hosts[].gpus, or the host's driver / CUDA_VISIBLE_DEVICES",
            }
        )
    disk = None
    ckpt = (config.get("env") or {}).get(Env.CHECKPOINT_DIR)
    if ckpt:
        found = free_disk(ckpt)
        if found:
            disk = {"path": found[0], "free_bytes": found[1]}
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "hostname": socket.gethostname(),
        "python": ".".join(map(str, sys.version_info[:3])),  # platform.python_version(), without its import
        "executable": sys.executable,
        "platform": _platform(),
        "packages": package_versions(),
        "gpus": gpus,
        "cpus": os.cpu_count(),
        "boot_id": _boot_id(),
        "mem_total_mb": _mem_total_mb(),
        "load1": load[0],
        "disk": disk,
        "time": time.time(),
        "problems": problems,
        "warnings": warnings,
    }


def _mem_total_mb() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    except (ValueError, OSError):
        return None


class GroupSampler:
    """CPU, memory and state of the training process and everything it started.

    The descendant scan walks /proc, so it runs every `rescan_every` samples; the processes found
    are remembered (pid + start time) so teardown can also reach those that left the group.
    """

    def __init__(self, pid: int, rescan_every: int = 5) -> None:
        self.pid = pid
        self._rescan_every = rescan_every
        self._n = 0
        self._procs: dict[int, Any] = {}
        self._last_cpu: float | None = None
        self._last_t: float | None = None
        self.seen: dict[int, float] = {}  # pid -> create_time of every descendant ever seen
        self._main: Any = None
        self._looked = False  # psutil's handle is taken at the first sample (a short task needs none)

    def _handle(self) -> Any:
        if not self._looked:
            self._looked = True
            psutil = load_psutil()
            try:
                self._main = psutil.Process(self.pid) if psutil else None
            except Exception:
                self._main = None
        return self._main

    def _rescan(self) -> None:
        if self._main is None:
            return
        try:
            kids = self._main.children(recursive=True)
        except Exception:
            kids = []
        procs = {self.pid: self._main}
        for k in kids:
            procs[k.pid] = self._procs.get(k.pid, k)
            try:
                self.seen.setdefault(k.pid, k.create_time())
            except Exception:
                pass
        self._procs = procs

    def sample(self) -> dict[str, Any]:
        if self._handle() is None:
            return {}
        if self._n % self._rescan_every == 0:
            self._rescan()
        self._n += 1
        cpu = 0.0
        rss = 0
        threads = 0
        alive = 0
        for pid, p in list(self._procs.items()):
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    cpu += t.user + t.system
                    rss += p.memory_info().rss
                    threads += p.num_threads()
                alive += 1
            except Exception:
                self._procs.pop(pid, None)
        try:
            state = self._main.status()
        except Exception:
            state = "gone"
        now = time.monotonic()
        cpu_pct = None
        if self._last_cpu is not None and self._last_t is not None and now > self._last_t:
            cpu_pct = max(0.0, (cpu - self._last_cpu) / (now - self._last_t) * 100.0)
        self._last_cpu, self._last_t = cpu, now
        return {
            "state": state,
            "cpu_pct": round(cpu_pct, 1) if cpu_pct is not None else None,
            "cpu_s": round(cpu, 2),
            "rss_mb": round(rss / (1024 * 1024), 1),
            "threads": threads,
            "nproc": alive,
        }


def _boot_id() -> str | None:
    """The kernel's boot id (Linux): hosts that report the same one run on one machine and share its cores,
    whatever their hostnames (network namespaces, containers, pods on one node). None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return text or None
