"""Shared helpers of the benchmark scripts in bench/.

Every script measures tfcluster's figure and its baseline side by side in ONE run (this machine is
shared and noisy: only ratios measured together mean something), on the project's SSH test bed
(tfcluster_testbed.Testbed: loopback addresses or the test bed's own network namespaces, never
anything else), cleans up everything it started, prints a small table and its ratio LAST, or one
JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from reporting import Report, cleanup_records, fmt, machine_info, median, record_cleanup  # noqa: E402, F401

from tfcluster_testbed import Testbed, leftovers  # noqa: E402
from tfcluster_testbed.waiting import WaitTimeout, wait_for  # noqa: E402  (fails loudly: what it waited for, the last value)

PY = sys.executable  # the real interpreter (not a pyenv shim): what the launcher and job.python use

__all__ = [
    "PY",
    "REPO",
    "Measured",
    "ProcSampler",
    "Report",
    "WaitTimeout",
    "base_parser",
    "events",
    "job_processes",
    "launcher_argv",
    "launcher_env",
    "machine_info",
    "median",
    "run_measured",
    "testbed",
    "wait_for",
    "write_ssh_config",
]


# ------------------------------------------------------------------------------------------ CLI


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the `with testbed(...)` blocks: everything started is stopped


def base_parser(description: str) -> argparse.ArgumentParser:
    # SIGTERM/SIGHUP (e.g. a CI timeout) clean up like Ctrl-C does, instead of leaving sshd/workers behind.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short version (fewer/shorter repetitions)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per configuration (default: script's)")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    return ap


_VERBOSE = False


def set_verbose(on: bool) -> None:
    global _VERBOSE
    _VERBOSE = on


def say(msg: str) -> None:
    """Progress on stderr (always brief; -v adds details via detail())."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def detail(msg: str) -> None:
    if _VERBOSE:
        say(msg)


def fleet_traffic(interval: float) -> list[str]:
    """``tests/loadfleet.py``'s traffic at a heartbeat every ``interval`` s: a step-clock window every 5
    heartbeats and a log line every 10, so ``--interval 4`` at 16,384 tasks sends what 4,096 send at 1 Hz."""
    return ["--interval", str(interval), "--profile-s", str(5 * interval), "--log-rate", str(0.1 / interval)]


# ----------------------------------------------------------------------------------- processes


def launcher_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["NO_COLOR"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if extra:
        env.update(extra)
    return env


def launcher_argv(tb: Testbed, *args: str) -> list[str]:
    """`python -m orchestrator ARGS...` where the launcher must run (controller netns in netns mode)."""
    return tb.launcher_argv([PY, "-m", "orchestrator", *args])


@dataclass
class Measured:
    """One finished process: wall time and the CPU of the process and the children IT waited for
    (os.wait4 rusage of that one child, so nothing else this script runs is counted)."""

    argv: list[str]
    rc: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_mb: float
    t_start: float  # time.time() just before the fork
    t_end: float
    stdout: str
    stderr: str
    timed_out: bool = False
    box_cpu_s: float = 0.0  # busy CPU of the whole machine during the run (all processes, others' too)

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


def run_measured(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: str | Path | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    stdout_path: str | Path | None = None,
) -> Measured:
    """Run argv, return wall time and its rusage (user+sys of it and its waited-for descendants).
    stdout/stderr go to temp files (no pipe can fill up and throttle the process)."""
    with tempfile.TemporaryFile() as ferr, contextlib.ExitStack() as stack:
        fout = open(stdout_path, "wb") if stdout_path else tempfile.TemporaryFile()  # noqa: SIM115
        stack.enter_context(fout)
        box0 = box_cpu_s()
        t_start = time.time()
        t0 = time.monotonic()
        p = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, env=env, cwd=str(cwd or REPO)
        )
        if on_start is not None:
            on_start(p)
        timed_out = False
        deadline = t0 + timeout
        status = ru = None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            if time.monotonic() > deadline and not timed_out:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.002)
        wall = time.monotonic() - t0
        t_end = time.time()
        box = box_cpu_s() - box0
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
        out = b""
        if not stdout_path:
            fout.seek(0)
            out = fout.read()
        ferr.seek(0)
        err = ferr.read()
    return Measured(
        list(argv),
        p.returncode,
        wall,
        ru.ru_utime,
        ru.ru_stime,
        ru.ru_maxrss / 1024.0,
        t_start,
        t_end,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        timed_out,
        box,
    )


def box_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every process, every core)."""
    t = psutil.cpu_times()
    return t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class ProcSampler(threading.Thread):
    """Samples one process (psutil) every `interval` s: CPU times (itself, children excluded), RSS."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True, name=f"sampler-{pid}")
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, cpu_s, rss_mb)
        self._stop = threading.Event()

    def sample(self) -> tuple[float, float, float] | None:
        try:
            with self.proc.oneshot():
                t = self.proc.cpu_times()
                rss = self.proc.memory_info().rss / 2**20
        except psutil.Error:
            return None
        s = (time.monotonic(), t.user + t.system, rss)
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self._stop.is_set():
            if self.sample() is None:
                return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self.join(timeout=5)

    def window(self, t_from: float, t_to: float) -> dict[str, float] | None:
        """CPU % of one core and max RSS between the first sample >= t_from and the last <= t_to."""
        sel = [s for s in self.samples if t_from <= s[0] <= t_to]
        if len(sel) < 2:
            return None
        dt = sel[-1][0] - sel[0][0]
        return {
            "cpu_pct": 100.0 * (sel[-1][1] - sel[0][1]) / dt if dt > 0 else float("nan"),
            "cpu_s": sel[-1][1] - sel[0][1],
            "seconds": dt,
            "max_rss_mb": max(s[2] for s in sel),
        }


def job_processes(tb: Testbed) -> dict[str, list[psutil.Process]]:
    """Processes of a job on each host: everything the test bed sees there except sshd's own
    processes (a per-connection sshd on a cut host lives until TCP gives up) and zombies."""
    out: dict[str, list[psutil.Process]] = {}
    for name, procs in tb.processes_by_host().items():
        for p in procs:
            try:
                if p.status() == psutil.STATUS_ZOMBIE or p.name() == "sshd":
                    continue
            except psutil.Error:
                continue
            out.setdefault(name, []).append(p)
    return out


def events(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def first_ts(evs: list[dict[str, Any]], kind: str) -> float | None:
    return next((e["ts"] for e in evs if e["event"] == kind), None)


def last_ts(evs: list[dict[str, Any]], kind: str) -> float | None:
    ts = [e["ts"] for e in evs if e["event"] == kind]
    return max(ts) if ts else None


# ------------------------------------------------------------------------------------ test bed


@contextlib.contextmanager
def testbed(n_hosts: int, **kw: Any) -> Iterator[Testbed]:
    """A started Testbed, stopped at the end; then checks that nothing of it is left (processes,
    namespaces, directory) and records the verdict for the report."""
    tb = Testbed(n_hosts, **kw)
    t0 = time.monotonic()
    tb.start()
    say(f"test bed {tb.id}: {n_hosts} {tb.mode} hosts up in {time.monotonic() - t0:.1f}s")
    try:
        yield tb
    finally:
        tb.stop()
        left = leftovers(tb)
        for _ in range(50):
            if not left:
                break
            time.sleep(0.1)
            left = leftovers(tb)
        rec = {"testbed": tb.id, "mode": tb.mode, "hosts": n_hosts, "leftovers": left, "stop_errors": tb.stop_errors}
        record_cleanup(rec)
        if left or tb.stop_errors:
            say(f"WARNING: test bed {tb.id} left: {left} {tb.stop_errors}")


def write_ssh_config(tb: Testbed, path: Path) -> None:
    """An OpenSSH client config with one `Host hostN` entry per test-bed host (address, port, key,
    the test bed's known_hosts, StrictHostKeyChecking yes): for ssh, scp and pdsh baselines."""
    lines = []
    for h in tb.hosts:
        lines += [
            f"Host {h.name}",
            f"    HostName {h.address}",
            f"    Port {h.ssh_port}",
            f"    User {tb.user}",
            f"    IdentityFile {tb.user_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {tb.known_hosts}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ControlMaster no",
            "",
        ]
    path.write_text("\n".join(lines))
