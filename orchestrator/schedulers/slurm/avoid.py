"""After Slurm requeued a job by itself because one of its nodes failed: leave that node out next time.

With ``--requeue``, a job whose node fails (NODE_FAIL; for a job with spares, the batch script's own
node) goes back to the queue, and Slurm may give the next allocation the same node as soon as it
answers again — a flapping node fails the run again and again. Slurm's requeue has no option to avoid
it (25.11's ``--requeue=expedite`` only starts the job sooner). So the follower on the login node,
which sees the job go from RUNNING back to PENDING, asks Slurm which nodes of the allocation just lost
do not answer or are down (``sinfo``: a ``*`` suffix, ``down``, ``drain``, ``fail``), and adds them to
the pending job's ``ExcNodeList`` (``scontrol update``, kept with what the job already excluded).
Slurm takes ``ExcNodeList`` for a pending job in every version supported here (22.05 on:
``versions``); a running job refuses it, which is why this happens in the requeue's pending window
(``cred_expire``, 120 s by default, before a requeued job may start again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker_entry.agent.modes.hostlist import expand_hostlist

from . import commands as sc
from .versions import avoid_nodes_argv

FAILED_STATES = ("down", "drain", "drng", "fail")  # sinfo %t, besides a "*" (not responding) suffix
REQUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def failed_nodes(sinfo_out: str, nodes: Sequence[str]) -> list[str]:
    """Of ``nodes``, those ``sinfo -h -N -o '%N|%t'`` shows not responding, down, drained or failing."""
    wanted, found = set(nodes), []
    for line in sinfo_out.splitlines():
        name, _, state = line.strip().partition("|")
        if name in wanted and name not in found and (state.endswith("*") or state.startswith(FAILED_STATES)):
            found.append(name)
    return [n for n in nodes if n in found]


def excluded_of(scontrol_out: str) -> list[str]:
    """The job's ``ExcNodeList`` in ``scontrol show job -o`` (empty when none)."""
    for word in scontrol_out.split():
        key, _, value = word.partition("=")
        if key == "ExcNodeList" and value not in ("", "(null)"):
            try:
                return expand_hostlist(value)
            except ValueError:
                return []
    return []


class RequeueWatch:
    """Sees the job go from RUNNING back to the queue; then names the allocation it lost (once)."""

    def __init__(self) -> None:
        self.running_on = ""

    def see(self, state: str, nodes: str) -> list[str]:
        if state == "RUNNING":
            self.running_on = nodes or self.running_on
            return []
        if state in REQUEUED and self.running_on:
            lost, self.running_on = self.running_on, ""
            try:
                return expand_hostlist(lost)
            except ValueError:
                return []
        return []


def avoid_failed(job_id: str, allocation: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """Add the nodes of ``allocation`` that failed to the pending job's ExcNodeList; the nodes added
    (empty: none failed). SlurmError when Slurm refuses."""
    if not allocation:
        return []
    out = sc.run(["sinfo", "-h", "-N", "-n", ",".join(allocation), "-o", "%N|%t"], env=env, timeout=15.0)
    return exclude_more(job_id, failed_nodes(out, allocation), env)


def exclude_more(job_id: str, nodes: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """Add ``nodes`` to the pending job's ExcNodeList, keeping what it already excludes (``scontrol
    update`` replaces the list: the user's own ``--exclude`` would be lost); the nodes added."""
    if not nodes:
        return []
    already = excluded_of(sc.run(["scontrol", "show", "job", "-o", job_id], env=env, timeout=15.0))
    added = [n for n in dict.fromkeys(nodes) if n not in already]
    if added:
        sc.run(avoid_nodes_argv(job_id, [*already, *added]), env=env, timeout=15.0)
    return added
