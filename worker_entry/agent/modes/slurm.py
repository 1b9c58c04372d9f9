"""``python -m worker_entry slurm``: one task of an ``srun`` step builds its own TF_CONFIG, then connects back.

Slurm decides where the tasks run, so only the task itself knows its cluster: its rank
(``SLURM_PROCID``), the step's nodes (``SLURM_STEP_NODELIST``, expanded by ``scontrol show hostnames``
or ``hostlist``), how many tasks each node runs (``SLURM_STEP_TASKS_PER_NODE``, block distribution)
and where the nodes are reached: their ``NodeAddr`` (from the supervisor's one ``scontrol show node``
in ``TFCLUSTER_SLURM_NODE_ADDRS``, else ``scontrol`` here, else the node name) — never a name that
this host resolves to 127.0.1.1 (Debian's alias of its own hostname, unreachable from the others).

Ports: TensorFlow's gRPC server binds ``*:port``, so tasks that share an address need distinct
ports. Every task computes the same table: a block of ports derived from the job and step id (a
restart, a new step, gets another block; two jobs on one node almost never share one), and within it
one port per task sharing an address, in rank order. TF 2.21's ``SlurmClusterResolver`` gives every
task on a node the same port and needs GPUs; this does neither. Whether the port is free is checked
by worker_entry's facts (``tf_port``): a busy port stops the job before TensorFlow starts.

Then the task dials the supervisor (``worker_entry.agent.modes.connect``) with its rank, gets its ``NodeConfig``
(the plan's environment, no cluster), adds the cluster and its port, and runs the task (whose TF_CONFIG
worker_entry builds from them, as over SSH).
Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...protocol.cluster import gpu_slice, task_order
from ...protocol.cluster import tf_config as cluster_tf_config
from ...protocol.env import Env
from ...protocol.roles import CLUSTER_ROLES, ROLES, role_order
from .hostlist import expand_hostlist, expand_tasks_per_node

PORT_LO, PORT_HI = 12000, 32000  # below Linux's ephemeral range (32768-60999): no outgoing socket takes them
SCONTROL_TIMEOUT_S = 20.0
MAX_OUTPUT = 8 << 20
ADDRESS_RE = re.compile(r"^[A-Za-z0-9._-]{1,253}$|^[0-9A-Fa-f:.]{2,45}$")
SELF_ALIAS = "127.0.1.1"

Runner = Callable[[Sequence[str]], "str | None"]


class SlurmEnvError(ValueError):
    """What Slurm told this task does not make a cluster (or is not what tfcluster asked for)."""


@dataclass(frozen=True)
class Step:
    """This task's view of its step, validated."""

    rank: int
    ntasks: int
    node_index: int
    local_id: int
    job_id: int
    step_id: int
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]

    @property
    def layout(self) -> list[tuple[int, int]]:
        return rank_layout(self.tasks_per_node)


def _int(env: Mapping[str, str], name: str, lo: int = 0, hi: int = 1 << 31, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is not None:
            return default
        raise SlurmEnvError(
            f"{name} is not set: run under srun (tfcluster starts `srun ... python -m worker_entry slurm`)"
        )
    if not raw.strip().isdigit() or len(raw) > 12 or not lo <= int(raw) < hi:
        raise SlurmEnvError(f"{name}={raw[:40]!r}: expected a number in [{lo}, {hi})")
    return int(raw)


def run_scontrol(argv: Sequence[str]) -> str | None:
    """stdout of ``scontrol ARGS`` (bounded), or None when it is missing or fails (containers often lack it)."""
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *argv], capture_output=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or len(proc.stdout) > MAX_OUTPUT:
        return None
    return proc.stdout.decode("utf-8", "replace")


def expand_nodes(nodelist: str, run: Runner | None = run_scontrol) -> list[str]:
    """The step's nodes: ``scontrol show hostnames`` when it works, else the pure-Python expansion."""
    if run is not None:
        out = run(["show", "hostnames", nodelist])
        if out:
            names = out.split()
            if names and all(ADDRESS_RE.match(n) for n in names):
                return names
    try:
        return expand_hostlist(nodelist)
    except ValueError as exc:
        raise SlurmEnvError(f"SLURM_STEP_NODELIST: {exc}") from None


def step_from_env(env: Mapping[str, str], run: Runner | None = run_scontrol) -> Step:
    """Read and cross-check the step's variables (bounded; garbage is a SlurmEnvError, never a crash)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    tpn_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    if not nodelist or not tpn_text:
        raise SlurmEnvError("SLURM_STEP_NODELIST / SLURM_STEP_TASKS_PER_NODE are not set: run under srun")
    nodes = expand_nodes(nodelist, run)
    try:
        tasks_per_node = expand_tasks_per_node(tpn_text)
    except ValueError as exc:
        raise SlurmEnvError(f"SLURM_STEP_TASKS_PER_NODE: {exc}") from None
    if len(tasks_per_node) != len(nodes):
        raise SlurmEnvError(f"{len(nodes)} nodes in {nodelist!r} but {len(tasks_per_node)} counts in {tpn_text!r}")
    ntasks = _int(env, "SLURM_STEP_NUM_TASKS", 1, 1 << 20, default=sum(tasks_per_node))
    if ntasks != sum(tasks_per_node):
        raise SlurmEnvError(
            f"SLURM_STEP_NUM_TASKS={ntasks} but SLURM_STEP_TASKS_PER_NODE={tpn_text!r} sums to {sum(tasks_per_node)}"
        )
    step = Step(
        rank=_int(env, "SLURM_PROCID", 0, ntasks),
        ntasks=ntasks,
        node_index=_int(env, "SLURM_NODEID", 0, len(nodes)),
        local_id=_int(env, "SLURM_LOCALID", 0, 1 << 20),
        job_id=_int(env, "SLURM_JOB_ID", 0, 1 << 32),
        step_id=_int(env, "SLURM_STEP_ID", 0, 1 << 32, default=0),
        nodes=tuple(nodes),
        tasks_per_node=tuple(tasks_per_node),
    )
    if step.layout[step.rank] != (step.node_index, step.local_id):
        raise SlurmEnvError(
            f"rank {step.rank} runs on node {step.node_index} as local task {step.local_id}, but a block "
            f"distribution over {tpn_text!r} puts it at {step.layout[step.rank]}: tfcluster needs "
            "--distribution=block (do not override it in slurm.extra_args)"
        )
    return step


def rank_layout(tasks_per_node: Sequence[int]) -> list[tuple[int, int]]:
    """(node index, local id) of every rank under Slurm's block distribution."""
    return [(node, local) for node, count in enumerate(tasks_per_node) for local in range(count)]


def parse_node_addrs(text: str) -> dict[str, str]:
    """``n1=10.0.0.1,n2=10.0.0.2`` (TFCLUSTER_SLURM_NODE_ADDRS) or ``scontrol show node -o`` output."""
    out: dict[str, str] = {}
    if "NodeName=" in text:
        for line in text.splitlines():
            name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
            addr = re.search(r"(?:^|\s)NodeAddr=(\S+)", line)
            if name and addr and ADDRESS_RE.match(name.group(1)) and ADDRESS_RE.match(addr.group(1)):
                out[name.group(1)] = addr.group(1)
        return out
    for item in text.split(","):
        name, sep, addr = item.strip().partition("=")
        if sep and ADDRESS_RE.match(name) and ADDRESS_RE.match(addr):
            out[name] = addr
    return out


def node_addresses(
    nodes: Sequence[str],
    nodelist: str,
    env: Mapping[str, str],
    run: Runner | None = run_scontrol,
    resolve: Callable[[str], list[str]] | None = None,
) -> list[str]:
    """Where the other tasks reach each node: its NodeAddr, else its name; never Debian's 127.0.1.1."""
    known = parse_node_addrs(env.get(Env.SLURM_NODE_ADDRS, ""))
    if not all(n in known for n in nodes) and run is not None:
        out = run(["show", "node", "-o", nodelist])
        if out:
            known.update(parse_node_addrs(out))
    addrs = [known.get(n, n) for n in nodes]
    resolve = resolve or _resolve
    for name, addr in zip(nodes, addrs, strict=True):
        if not ADDRESS_RE.match(addr):
            raise SlurmEnvError(f"node {name}: {addr!r} is not an address")
        if len(set(nodes)) > 1 and resolve(addr) == [SELF_ALIAS]:
            raise SlurmEnvError(
                f"node {name} is reached as {addr!r}, which resolves to {SELF_ALIAS} (the Debian /etc/hosts alias of "
                "a host's own name): the other nodes cannot reach it there. Give the nodes a NodeAddr in slurm.conf "
                "or fix /etc/hosts"
            )
    return addrs


def _resolve(addr: str) -> list[str]:
    with contextlib.suppress(OSError, UnicodeError):
        return sorted({info[4][0] for info in socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)})
    return []


def task_ports(addrs_by_rank: Sequence[str], job_id: int, step_id: int, base: int | None = None) -> list[int]:
    """One port per rank: distinct among ranks that share an address, the same table on every task.

    ``base`` (``tensorflow.port`` when the spec sets it) fixes the block's start; otherwise the block
    is derived from the job and step id, so a restart (a new step) and another job get other ports."""
    seen: dict[str, int] = {}
    offsets = []
    for addr in addrs_by_rank:
        offsets.append(seen.get(addr, 0))
        seen[addr] = offsets[-1] + 1
    width = max(seen.values(), default=1)
    if base is None:
        blocks = max(1, (PORT_HI - PORT_LO) // width)
        base = PORT_LO + ((job_id * 7919 + step_id * 104729) % blocks) * width
    if base + width - 1 > 65535:
        raise SlurmEnvError(f"tensorflow.port {base} + {width} tasks on one address exceeds 65535")
    return [base + off for off in offsets]


def tasks_by_rank(ntasks: int, chief: bool, roles: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """The plan's order: by role when the job has roles (chief, workers, ps, evaluator); else rank 0
    is the chief when there is one (the planner uses the same rules)."""
    if roles:
        bad = [r for r, n in roles.items() if r not in ROLES or not isinstance(n, int) or n < 0]
        if bad or sum(roles.values()) != ntasks:
            raise SlurmEnvError(f"the plan's roles {dict(roles)} do not make the step's {ntasks} tasks")
        return role_order(dict(roles))
    return task_order(ntasks, chief)


def has_chief(rank: int, task_type: str, task_index: int) -> bool:
    """Whether the plan has a chief, from this rank's task (chief:0 at rank 0, then worker:rank-1)."""
    if task_type == "chief" and rank == 0 and task_index == 0:
        return True
    if task_type == "worker" and task_index == rank:
        return False
    if task_type == "worker" and task_index == rank - 1:
        return True
    raise SlurmEnvError(f"rank {rank} was given task {task_type}:{task_index}: the step does not match the plan")


def tf_config(endpoints: Sequence[str], rank: int, chief: bool, roles: Mapping[str, int] | None = None) -> dict:
    """TF_CONFIG for ``rank``: exactly what TFConfigClusterResolver reads. An evaluator is left out of
    the cluster (as TensorFlow's docs do); its own endpoint is unused."""
    tasks = tasks_by_rank(len(endpoints), chief, roles)
    cluster: dict[str, list[str]] = {}
    for (kind, _), ep in zip(tasks, endpoints, strict=True):
        if kind in CLUSTER_ROLES:
            cluster.setdefault(kind, []).append(ep)
    kind, index = tasks[rank]
    return cluster_tf_config(cluster, kind, index)


def task_of(rank: int, ntasks: int, task_type: str, task_index: int, roles: Mapping[str, int]) -> bool:
    """Check the supervisor's task for this rank against the plan's order; returns whether the cluster
    has a chief (the MWMS rule when the job has no roles)."""
    if not roles:
        return has_chief(rank, task_type, task_index)
    if tasks_by_rank(ntasks, False, roles)[rank] != (task_type, task_index):
        raise SlurmEnvError(f"rank {rank} was given task {task_type}:{task_index}: the step does not match the plan")
    return roles.get("chief", 0) > 0


def endpoints(step: Step, addrs: Sequence[str], base: int | None = None) -> tuple[list[str], list[int]]:
    """``ADDR:PORT`` of every rank, and the ports."""
    by_rank = [addrs[node] for node, _ in step.layout]
    ports = task_ports(by_rank, step.job_id, step.step_id, base)
    return [f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a, p in zip(by_rank, ports, strict=True)], ports


def main(env: Mapping[str, str] = os.environ, stdin_fd: int = 0) -> int:
    """Build this task's cluster from Slurm, connect back (the secret on stdin: srun forwards the
    supervisor's to every task), run the task."""
    from ...protocol import NodeConfig, ProtocolError
    from ...protocol.seal import CryptoUnavailable, check_available
    from .connect import connect_back, dial_attempt, parse_address, read_secret, serve

    try:
        step = step_from_env(env)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        addrs = node_addresses(step.nodes, nodelist, env)
        address = parse_address(env.get(Env.CONNECT, ""))
        secret = read_secret(stdin_fd)
        check_available()
    except (ValueError, CryptoUnavailable) as exc:
        print(f"worker_entry slurm: {exc}", file=sys.stderr)
        return 2
    try:
        link = connect_back(address, secret, step.rank, attempt=dial_attempt(env))
    except OSError as exc:
        print(
            f"worker_entry slurm: rank {step.rank}: cannot reach the supervisor at {address[0]}:{address[1]}: {exc}",
            file=sys.stderr,
        )
        return 3
    try:
        config = NodeConfig.parse_line(link.config_line)
        chief = task_of(step.rank, step.ntasks, config.task.type, config.task.index, config.roles)
        eps, ports = endpoints(step, addrs, config.tf_port)
        cfg = tf_config(eps, step.rank, chief, config.roles)
    except (ProtocolError, ValueError) as exc:
        print(f"worker_entry slurm: rank {step.rank}: {exc}", file=sys.stderr)
        link.sock.close()
        return 2
    task_env = dict(config.env)
    share = gpu_slice(
        env.get("CUDA_VISIBLE_DEVICES", ""), step.local_id, config.gpus, step.tasks_per_node[step.node_index]
    )
    if share is not None:
        task_env["CUDA_VISIBLE_DEVICES"] = share
    port = ports[step.rank] if config.task.type in CLUSTER_ROLES else None  # an evaluator runs no TF server
    # worker_entry builds the task's TF_CONFIG from the cluster (``NodeConfig.tf_config_json``)
    return serve(dataclasses.replace(config, env=task_env, cluster=cfg["cluster"], tf_port=port), link)


def run(argv: list[str]) -> int:
    """``python -m worker_entry slurm ...`` (``agent.main`` finds this mode by its name)."""
    return main()
