"""A real Slurm on this one machine: munged, slurmctld and three slurmd (``n1``..``n3``).

Used by the tests and the benchmarks of tfcluster's Slurm backend. Everything lives under one scratch
directory — munge key and socket, slurm.conf, state, spools, logs, pid files — with its own cluster
name and free ports, so several clusters (other engineers' test runs) can share the machine.
:meth:`LocalSlurm.stop` cancels every job of this cluster, stops the daemons by PID (never by name
or pattern), kills any process still carrying this cluster's ``SLURM_CONF`` in its environment (a
task that escaped its step), and removes the directory. Needs Debian's ``slurm-wlm`` and ``munge``
and root (slurmd runs tasks as their submitter; munged and slurmd as root here).

Facts this relies on (measured: ``../shared/notes/slurm-on-one-machine.md``): several slurmd on one
host with ``NodeAddr=127.0.0.1`` and distinct ``Port=``; three tasks on a node with CPUs=2 need
``--overcommit`` (so nodes declare 4 CPUs with ``SlurmdParameters=config_overrides``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import psutil

from .base import TestbedError
from .waiting import WaitTimeout, wait_for

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "squeue", "scancel")
DIR_PREFIX = "tfcluster-slurm-"
NODES = ("n1", "n2", "n3")


def missing_binaries() -> list[str]:
    """The Slurm/munge programs this machine lacks (empty: a local cluster can be started)."""
    found = []
    for name in SLURM_BINARIES:
        if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}"):
            found.append(name)
    return found


def available() -> tuple[bool, str]:
    """(can start, why not)."""
    missing = missing_binaries()
    if missing:
        return False, f"Slurm is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.getuid() != 0:
        return False, "a local Slurm needs root (munged and slurmd run as root here)"
    return True, ""


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


#: The daemons' ports: below both Linux's ephemeral range (32768-60999) and the block tasks derive their
#: TF ports from (``worker_entry.agent.modes.slurm.PORT_LO``-``PORT_HI``, 12000-32000): every virtual node shares
#: 127.0.0.1, so a slurmd there would take a task's port now and then (preflight: "in use by slurmd").
DAEMON_PORTS = range(10000, 12000)


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports of ``DAEMON_PORTS`` (kept bound while choosing)."""
    socks, ports = [], []
    lo, size = DAEMON_PORTS.start, len(DAEMON_PORTS)
    try:
        rng = int.from_bytes(os.urandom(2), "big")
        candidate = lo + rng % size
        while len(ports) < n:
            candidate = lo + (candidate - lo + 7) % size
            s = socket.socket()
            try:
                s.bind(("0.0.0.0", candidate))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(candidate)
    finally:
        for s in socks:
            s.close()
    return ports


class LocalSlurm:
    """slurmctld + slurmd n1..n3 on this machine, all state under ``self.dir``."""

    def __init__(
        self, *, cpus: int = 4, kill_wait_s: int = 5, cred_expire_s: int = 5, extra_conf: Sequence[str] = ()
    ) -> None:
        self.name = "tfc" + uuid.uuid4().hex[:8]
        self.cpus = cpus
        self.kill_wait_s = kill_wait_s
        self.cred_expire_s = cred_expire_s  # also how long a requeued job waits before it may start again
        self.extra_conf = list(extra_conf)
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        os.chmod(self.dir, 0o755)  # slurmd reads the conf; tasks run as the submitter
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.nodes = NODES
        self.procs: list[subprocess.Popen] = []
        self.started = False

    # --- environment for clients ------------------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment in which sbatch/srun/squeue/scontrol talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
            del env[k]  # a test run from inside another allocation must not leak its job into ours
        return env

    def run(self, argv: Sequence[str], timeout: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            list(argv), env=kw.pop("env", None) or self.env(), capture_output=True, text=True, timeout=timeout, **kw
        )
        if check and proc.returncode != 0:
            raise TestbedError(f"{' '.join(argv)}: rc {proc.returncode}: {proc.stderr.strip()[:500]}")
        return proc

    # --- start -----------------------------------------------------------------------------------

    def start(self) -> LocalSlurm:
        ok, why = available()
        if not ok:
            raise TestbedError(why)
        try:
            self._start_munge()
            self._write_conf()
            self._start_daemons()
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.started = True
        return self

    def _start_munge(self) -> None:
        mdir = self.dir / "munge"
        mdir.mkdir(mode=0o700)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        argv = [
            _sbin("munged"),
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={mdir / 'munged.log'}",
            f"--pid-file={mdir / 'munged.pid'}",
            f"--seed-file={mdir / 'munged.seed'}",
            "--foreground",
        ]
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_for(lambda: self.munge_socket.exists(), 10, "munged to create its socket")
        os.chmod(mdir, 0o755)  # clients (tasks of other users) reach the socket

    def _write_conf(self) -> None:
        d = self.dir
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname()
        for sub in ("state", "log", "spool", *(f"spool/{n}" for n in self.nodes)):
            (d / sub).mkdir(exist_ok=True)
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire_s}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            f"KillWait={self.kill_wait_s}",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SchedulerParameters=sched_interval=1",
            *self.extra_conf,
        ]
        for name, port in zip(self.nodes, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        os.chmod(self.conf, 0o644)

    def _start_daemons(self) -> None:
        env = self.env()
        log = open(self.dir / "log" / "daemons.out", "ab")  # noqa: SIM115 - held by the children
        try:
            self.procs.append(
                subprocess.Popen(
                    [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=env, stdout=log, stderr=log
                )
            )
            for n in self.nodes:
                self.procs.append(
                    subprocess.Popen(
                        [_sbin("slurmd"), "-D", "-N", n, "-f", str(self.conf)], env=env, stdout=log, stderr=log
                    )
                )
        finally:
            log.close()

    def _wait_idle(self, timeout: float = 30) -> None:
        def idle() -> bool:
            for p in self.procs:
                if p.poll() is not None:
                    raise TestbedError(f"{p.args[0]} exited with {p.returncode}; see {self.dir / 'log'}")
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
            return out.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

        self._wait_for(idle, timeout, "the Slurm nodes to become idle")

    @staticmethod
    def _wait_for(pred, timeout: float, what) -> None:
        """The test bed's one wait (``waiting.wait_for``), failing as the ``TestbedError`` a bed that
        could not be built raises."""
        try:
            wait_for(pred, timeout, what)
        except WaitTimeout as exc:
            raise TestbedError(str(exc)) from None

    # --- use -------------------------------------------------------------------------------------

    def jobs(self) -> list[str]:
        out = self.run(["squeue", "-h", "-o", "%i"], check=False)
        return out.stdout.split()

    def cancel_all(self, timeout: float = 30) -> None:
        """scancel every job of this cluster and wait until the queue is empty."""
        if not self.conf.exists():
            return
        self.run(["scancel", "--full", "-u", str(os.getuid())], check=False)
        self._wait_for(lambda: not self.jobs(), timeout, lambda: f"the queue to empty (left: {self.jobs()})")

    def processes(self, *, stepd: bool = False) -> list[psutil.Process]:
        """Processes (other than our daemons) that carry this cluster's SLURM_CONF: jobs' processes —
        the tasks, srun, salloc; with ``stepd`` also Slurm's own slurmstepd (it outlives its tasks by a
        moment while it cleans up)."""
        mine = {p.pid for p in self.procs}
        for p in self.procs:  # slurmctld's own helpers (slurmscriptd) are daemons too
            with contextlib.suppress(psutil.Error):
                mine.update(c.pid for c in psutil.Process(p.pid).children(recursive=True) if c.name() != "slurmstepd")
        needle = f"SLURM_CONF={self.conf}".encode()
        found = []
        for p in psutil.process_iter(["name"]):
            if p.pid in mine or p.pid == os.getpid() or (not stepd and p.info["name"] == "slurmstepd"):
                continue
            try:
                with open(f"/proc/{p.pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(p)
            except OSError:
                continue
        return found

    def stepds(self) -> list[psutil.Process]:
        """slurmstepd processes of this cluster (their parent is gone; they hold our spool dir open)."""
        spool = str(self.dir / "spool")
        found = []
        for p in psutil.process_iter(["name"]):
            if p.info["name"] != "slurmstepd":
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if any(str(f.path).startswith(spool) for f in p.open_files()) or str(p.cwd()).startswith(spool):
                    found.append(p)
        return found

    # --- a node that fails like a host losing power ------------------------------------------------

    def _slurmd(self, node: str) -> subprocess.Popen:
        for p in self.procs:
            if p.args[:4] == [_sbin("slurmd"), "-D", "-N", node] and p.poll() is None:
                return p
        raise TestbedError(f"no running slurmd for node {node}")

    def fail_node(self, node: str, task_pid: int) -> list[int]:
        """``node`` stops answering, as if its host lost power: its slurmd is SIGKILLed, and so is the
        job step running there — found from ``task_pid`` (a process of one of this test's tasks on that
        node) up through its ancestors to its ``slurmstepd`` (which double-forked away from slurmd), then
        that slurmstepd and every descendant. Never by name over the machine. Returns the PIDs killed."""
        stepd = psutil.Process(task_pid)
        while stepd.name() != "slurmstepd":
            parent = stepd.parent()
            if parent is None or parent.pid <= 1:
                raise TestbedError(f"pid {task_pid} does not run under a slurmstepd")
            stepd = parent
        node_log = str(self.dir / "log" / f"slurmd-{node}.log")  # a slurmstepd logs to its node's slurmd log
        if node_log not in {f.path for f in stepd.open_files()}:
            raise TestbedError(f"pid {task_pid}'s slurmstepd ({stepd.pid}) is not node {node}'s")
        victims = [stepd, *stepd.children(recursive=True)]
        daemon = self._slurmd(node)
        daemon.kill()  # first: nothing on that node may restart or report anything
        daemon.wait()
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(victims, timeout=10)
        return [daemon.pid, *(p.pid for p in victims)]

    def restore_node(self, node: str, timeout: float = 60) -> None:
        """Bring a failed node back as the fixture started it (its slurmd again, then ``state=resume``
        where Slurm marked it DOWN) and wait until it answers: later tests see a healthy cluster."""
        try:
            self._slurmd(node)
        except TestbedError:
            log = open(self.dir / "log" / "daemons.out", "ab")  # noqa: SIM115 - held by the child
            try:
                self.procs.insert(
                    1,  # with the other slurmd: stop() ends slurmd before slurmctld, munged last
                    subprocess.Popen(
                        [_sbin("slurmd"), "-D", "-N", node, "-f", str(self.conf)],
                        env=self.env(),
                        stdout=log,
                        stderr=log,
                    ),
                )
            finally:
                log.close()
        seen: list[str] = []

        def answers() -> bool:
            state = self._node_state(node)
            seen.append(state)
            if state.startswith(("down", "drain", "fail")):
                self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            return (
                bool(state)
                and not state.endswith(("*", "~", "#", "!", "%", "$", "@", "^", "-"))
                and not (state.startswith(("down", "drain", "fail")))
            )

        self._wait_for(answers, timeout, lambda: f"{node} to answer again (states seen: {sorted(set(seen))})")

    def _node_state(self, node: str) -> str:
        """sinfo's short state of ``node`` (``idle``, ``alloc``, ``down*``, ``idle*``...); "" if unknown."""
        out = self.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], check=False, timeout=10)
        return out.stdout.strip().split("\n")[0] if out.returncode == 0 else ""

    # --- stop ------------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Cancel all jobs, stop the daemons by PID, kill leftovers; returns what had to be killed."""
        killed: list[str] = []
        with contextlib.suppress(Exception):
            if self.procs and all(p.poll() is None for p in self.procs):
                self.cancel_all()
        for p in reversed(self.procs):  # slurmd first, then slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed.append(f"daemon {p.args[0]} (pid {p.pid}) ignored SIGTERM")
        for p in self.processes(stepd=True) + self.stepds():
            with contextlib.suppress(psutil.Error):
                killed.append(f"pid {p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)
        return killed

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
