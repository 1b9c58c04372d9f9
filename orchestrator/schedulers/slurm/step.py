"""The Slurm backend inside an allocation: one ``srun`` step per attempt, tasks connect back.

``srun`` starts ``python -m worker_entry slurm`` on every task; each builds its TF_CONFIG from Slurm's
variables and dials this supervisor (``backends.tcp``) with its rank and the per-run secret, which
travels only on srun's stdin (forwarded to every task), never in an environment. Teardown has three layers: Slurm's ``--kill-on-bad-exit`` (a task
that exits non-zero takes the step down), tfcluster's own stop over the channels (the normal path,
driven by the supervisor), and at ``close`` or the next attempt's launch — if srun is still there after
the supervisor is done — ``scancel --signal=KILL`` of the step, then of srun itself; at once when a node
of the step is known dead (it left the job for good, or Slurm says it is down or not responding),
where srun would otherwise wait for a slurmstepd that cannot report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker_entry.agent.modes.hostlist import expand_hostlist
from worker_entry.protocol import NodeConfig
from worker_entry.protocol.env import Env

from ...backends.backend import Deliver, Placement
from ...backends.tcp import ConnectBackBackend
from ...plan import NodePlan, Plan
from ...runs import RunDir
from ...spec import ClusterSpec
from . import commands as sc
from .avoid import failed_nodes
from .plan import restart_srun_argv, srun_argv

SRUN_EXIT_WAIT_S = 5.0  # srun ends by itself once its tasks have (our stop, or their own exit)
SRUN_QUICK_EXIT_S = 1.0  # ... usually within this: past it, ask whether a node of the step is known dead
SCANCEL_WAIT_S = 10.0
#: A node of the step known dead (it left the job for good, or Slurm says it does not respond): its
#: slurmstepd will never report, so srun would wait for nothing. scancel at once, in the background (on
#: this Slurm it blocks ~11 s, its controller trying the dead node), and give srun this long.
DEAD_NODE_SCANCEL_WAIT_S = 1.0
SCANCEL_JOIN_S = 35.0  # a background scancel (sc.cancel: at most 30 s) is reaped before the backend closes
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,253}$")
MAX_ADDRS_ENV = 64 << 10  # one env string must stay far below the kernel's 128 KiB limit


def allocation_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's nodes, in order (empty when unknown or unparsable)."""
    try:
        return expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    except ValueError:
        return []


def advertise_address(env: Mapping[str, str], addrs: Mapping[str, str]) -> str:
    """Where the tasks dial us: on a compute node (batch script) that node's NodeAddr; on a login node
    (salloc) the source address of our route to the first node (what the nodes see us as)."""
    here = env.get("SLURMD_NODENAME", "")
    if here:
        return addrs.get(here) or socket.gethostname()
    nodes = allocation_nodes(env)
    target = addrs.get(nodes[0], nodes[0]) if nodes else ""
    if target:
        with contextlib.suppress(OSError, UnicodeError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # UDP: picks the route, sends nothing
            return s.getsockname()[0]
    return socket.getfqdn()


def step_placement(allocation: Sequence[str], hosts: Sequence[str], spec: ClusterSpec) -> list[str]:
    """Where the step runs, as srun options: the plan's nodes (``--nodelist``) and every other node of
    the allocation left out (``--exclude``: the spares standing by, the nodes lost for good) — when the
    allocation holds more nodes than the step uses and the plan names its nodes (issue 34)."""
    used = list(dict.fromkeys(hosts))
    if not allocation or not used or not set(used) <= set(allocation):
        s = spec.slurm  # the plan's labels are not the allocation's names: its first nodes, as planned
        return [f"--nodelist={','.join(allocation[: s.nodes])}"] if s is not None and len(allocation) > s.nodes else []
    if len(allocation) <= len(used):
        return []
    others = [n for n in allocation if n not in used]
    return [f"--nodelist={','.join(used)}", f"--exclude={','.join(others)}"]


class SlurmStepBackend(ConnectBackBackend):
    """Tasks of one attempt = one srun step in the current allocation."""

    name = "slurm"
    restarts_tasks = True  # a task restarted in place is a one-task step of its own (--overlap)

    def __init__(
        self, spec: ClusterSpec, plan: Plan, *, log_dir: Path | None = None, env: Mapping[str, str] = os.environ
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.env = dict(env)
        self.job_id = sc.job_id_of(env)
        self.log_dir = log_dir  # RUN/slurm (bind_run): srun's output per attempt
        self.node_addrs = ""
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        if nodelist:
            with contextlib.suppress(sc.SlurmError):
                self.node_addrs = sc.node_addrs(nodelist)
        addrs = dict(item.split("=", 1) for item in self.node_addrs.split(",") if "=" in item)
        super().__init__(bind=("0.0.0.0", 0), advertise=advertise_address(env, addrs))
        self.srun: subprocess.Popen | None = None
        self.step_name = ""
        self.srun_log: Path | None = None
        self.notes: list[str] = []  # what the last-resort teardown had to do (the job reports it)
        self._watch: threading.Thread | None = None
        self._step_hosts: tuple[str, ...] = ()  # the current step's nodes
        self._cancels: list[threading.Thread] = []  # scancels of steps with a dead node, in the background
        # (task, step name, srun) of each restart in place this attempt, oldest first
        self.restarts: list[tuple[str, str, subprocess.Popen]] = []
        self._restart_lock = threading.Lock()
        self._starts: list[tuple[NodePlan, NodeConfig]] = []
        self._deliver: Deliver = lambda task, chan: None

    def bind_run(self, run_dir: Path) -> None:
        if self.log_dir is None:
            self.log_dir = RunDir(Path(run_dir)).slurm_dir

    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        base = (self.plan.extras or {}).get("tf_port_base")
        # The node derives its port (and TF_CONFIG); a fixed base only when the spec sets tensorflow.port.
        starts = [(n, dataclasses.replace(c, tf_port=base or None)) for n, c in starts]
        self._starts = list(starts)
        self._deliver = deliver
        return super().start_all(starts, deliver)

    def launch(self, starts: Sequence[tuple[NodePlan, NodeConfig]]) -> None:
        hosts = tuple(dict.fromkeys(n.host for n, _ in starts))
        # a restart: the previous attempt's step may still be winding down; a node it ran on that this
        # one leaves out left the job for good (a reshape: its task was judged lost for a host reason)
        self._end_step(left=[h for h in self._step_hosts if h not in hosts])
        self._end_restarts()  # and its tasks restarted in place
        if self.srun is not None and self.srun.poll() is None:
            raise OSError("the previous attempt's srun step is still running")
        attempt = starts[0][1].attempt
        ghost = self._step_on_the_books()
        argv = srun_argv(
            self.spec, starts[0][0].argv, attempt=attempt, nodes=self.step_nodes(starts), overlap=bool(ghost)
        )
        if ghost:
            self.notes.append(
                f"step {' '.join(ghost)} of the previous attempt is still listed by Slurm after the teardown (still "
                "completing, or a node that does not answer keeps it until marked DOWN): the new step shares its "
                "CPUs (srun --overlap) instead of waiting for them"
            )
        argv[2:2] = step_placement(allocation_nodes(self.env), [n.host for n, _ in starts], self.spec)
        self.step_name = argv[1].split("=", 1)[1]
        self._step_hosts = hosts
        env = {**self.env, **self.connect_env(), Env.ATTEMPT: str(attempt)}  # bound into each node's proof
        if self.node_addrs and len(self.node_addrs) < MAX_ADDRS_ENV:
            env[Env.SLURM_NODE_ADDRS] = self.node_addrs
        if self.log_dir is None:
            raise OSError("the Slurm backend has no run directory (bind_run was not called)")
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.srun_log = self.log_dir / f"srun-attempt-{attempt}.log"
        fd = os.open(self.srun_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Its own session: Ctrl-C on the terminal is the supervisor's to handle (a second one within a
            # second would make srun kill the step without our teardown).
            self.srun = subprocess.Popen(
                argv, env=env, stdin=subprocess.PIPE, stdout=fd, stderr=fd, start_new_session=True
            )
        finally:
            os.close(fd)
        self._give_secret(self.srun)
        self._watch = threading.Thread(target=self._watch_srun, args=(self.srun,), name="srun-watch", daemon=True)
        self._watch.start()

    def _step_on_the_books(self) -> list[str]:
        """The previous attempt's step ids that Slurm still lists after our teardown (its srun is gone)."""
        if not self.step_name or not self.job_id:
            return []
        try:
            return sc.steps_named(self.job_id, self.step_name)
        except sc.SlurmError:
            return []

    def step_nodes(self, starts: Sequence[tuple[NodePlan, NodeConfig]]) -> int:
        """The nodes this attempt's step runs on: one per host of its tasks (fewer after a shrink)."""
        return len(dict.fromkeys(n.host for n, _ in starts)) or (self.spec.slurm.nodes if self.spec.slurm else 1)

    def relaunch(self, rank: int, node: NodePlan, config: NodeConfig, placement: Placement) -> None:
        """A task restarted in place: a one-task step on the node it ran on, dialing back as ``rank``,
        with its share of the node's GPUs (its local slot in the block layout)."""
        name = placement.node_name or ""
        nodes = allocation_nodes(self.env)
        if not NODE_NAME_RE.match(name) or (nodes and name not in nodes):
            raise OSError(
                f"{node.task}: its node said no Slurm node name of this allocation ({name[:60]!r}): cannot start it there again"
            )
        task, slug = str(node.task), node.task.slug
        with self._restart_lock:
            n = 1 + sum(1 for t, _, _ in self.restarts if t == task)
            argv = restart_srun_argv(self.spec, node.argv[0], attempt=config.attempt, restart=n, node=name, slug=slug)
            per_node = self.spec.slurm.tasks_per_node if self.spec.slurm else 1
            env = {
                **self.env,
                **self.connect_env(),
                Env.RANK: str(rank),
                Env.GPU_SLOT: f"{rank % per_node}/{per_node}",
                Env.ATTEMPT: str(config.attempt),
            }
            assert self.log_dir is not None  # bound before the first step
            log = self.log_dir / f"srun-attempt-{config.attempt}-{slug}-restart-{n}.log"
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                proc = subprocess.Popen(
                    argv, env=env, stdin=subprocess.PIPE, stdout=fd, stderr=fd, start_new_session=True
                )
            finally:
                os.close(fd)
            self.restarts.append((task, argv[1].split("=", 1)[1], proc))
        self._give_secret(proc)
        rc = proc.wait()  # (this thread is the restart's own)
        time.sleep(0.5)  # a connection accepted just before srun's exit is being delivered
        if rank not in self.server.connected_ranks():
            text = log.read_bytes()[-8192:].decode("utf-8", "replace")
            tail = " | ".join(line.strip() for line in text.splitlines()[-8:] if line.strip())
            raise OSError(f"srun exited with code {rc} before the restarted task connected back: {tail}")

    def end_relaunch(self, task: str) -> None:
        with self._restart_lock:
            latest = [(name, proc) for t, name, proc in self.restarts if t == task][-1:]
        for name, proc in latest:
            threading.Thread(target=self._end_proc, args=(proc, name), name="srun-restart-end", daemon=True).start()

    def _end_restarts(self) -> None:
        """End the steps of this attempt's restarts in place (each is over once its task is)."""
        with self._restart_lock:
            taken, self.restarts = self.restarts, []
        for _, name, proc in taken:
            self._end_proc(proc, name)

    def _give_secret(self, proc: subprocess.Popen) -> None:
        """The run's secret on srun's stdin, which srun forwards to every task (``--input=all``): never in
        an environment, where /proc/PID/environ of srun, slurmstepd and the tasks would show it."""
        assert proc.stdin is not None
        try:
            proc.stdin.write(self.secret_input())
            proc.stdin.close()
        except OSError:  # srun is already gone: _watch_srun says why
            with contextlib.suppress(OSError):
                proc.stdin.close()

    def _watch_srun(self, proc: subprocess.Popen) -> None:
        """srun ended: every task that never connected will not (the step is gone) — say why."""
        rc = proc.wait()
        time.sleep(0.5)  # a connection accepted just before srun's exit is being delivered
        if self.srun is not proc:  # a restart's step runs now: its tasks are not this step's to judge
            return
        connected = self.server.connected_ranks()
        missing = [str(n.task) for rank, (n, _) in enumerate(self._starts) if rank not in connected]
        if not missing:
            return
        when = "before any task connected back" if not connected else "before this task connected back"
        why = OSError(f"srun exited with code {rc} {when}: {self.srun_tail()}")
        for task in missing:
            self._deliver(task, why)

    def srun_tail(self, lines: int = 8) -> str:
        """The last lines srun (and the tasks before they connected) printed."""
        if self.srun_log is None:
            return ""
        with contextlib.suppress(OSError):
            data = self.srun_log.read_bytes()[-8192:].decode("utf-8", "replace")
            return " | ".join(line.strip() for line in data.strip().splitlines()[-lines:] if line.strip())
        return ""

    def close(self) -> None:
        """Last teardown layer: srun still there after the supervisor is done → scancel the step."""
        self._end_step()
        self._end_restarts()
        for t in self._cancels:  # no scancel of ours outlives the run
            t.join(SCANCEL_JOIN_S)
        super().close()

    def _end_step(self, left: Sequence[str] = ()) -> None:
        """The current step's srun ends by itself once its tasks have; if it does not, scancel it — at
        once where a node of the step is known dead (``left``: it left the job for good)."""
        self._end_proc(self.srun, self.step_name, self._step_hosts, left)

    def _end_proc(
        self, proc: subprocess.Popen | None, step_name: str, nodes: Sequence[str] = (), left: Sequence[str] = ()
    ) -> None:
        if proc is None or proc.poll() is not None:
            return
        dead = list(left)
        if not dead:
            quick = min(SRUN_QUICK_EXIT_S, SRUN_EXIT_WAIT_S)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(quick)
            if proc.poll() is not None:
                return
            dead = self._failed(nodes)
            if not dead:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(SRUN_EXIT_WAIT_S - quick)
                if proc.poll() is not None:
                    return
        steps: list[str] = []
        with contextlib.suppress(sc.SlurmError):
            steps = sc.steps_named(self.job_id, step_name) if self.job_id else []
        if dead and steps:
            t = threading.Thread(target=_kill_steps, args=(steps,), name="scancel-dead-step", daemon=True)
            t.start()
            self._cancels.append(t)
        else:
            _kill_steps(steps)
        why = f" (node {', '.join(dead)} known dead: its srun cannot report)" if dead else ""
        self.notes.append(
            f"srun was still running after the teardown{why}: scancel --signal=KILL "
            f"{' '.join(steps) or '(step not found)'}"
        )
        try:
            proc.wait(DEAD_NODE_SCANCEL_WAIT_S if dead else SCANCEL_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.notes.append("srun did not exit after scancel: killed")

    def _failed(self, nodes: Sequence[str]) -> list[str]:
        """Of the step's ``nodes``, those Slurm shows not responding, down, drained or failing."""
        named = [n for n in nodes if NODE_NAME_RE.match(n)]
        if not named:
            return []
        try:
            out = sc.run(["sinfo", "-h", "-N", "-n", ",".join(named), "-o", "%N|%t"], timeout=15.0)
        except sc.SlurmError:
            return []
        return failed_nodes(out, named)


def _kill_steps(steps: Sequence[str]) -> None:
    for step in steps:
        with contextlib.suppress(sc.SlurmError):
            sc.cancel(step, signal="KILL")
