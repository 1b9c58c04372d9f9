"""Which Slurm this is, and what it may be asked for: features are detected by version, never assumed.

``sinfo --version`` (or ``scontrol --version``) prints ``slurm 22.05.8`` (``slurm-wlm 22.05.8`` on
Debian's packages). What depends on it here (issue 34):

* ``--requeue=expedite`` (sbatch, Slurm 25.11+): a batch job requeued at once on a node failure, ahead of
  every other job; older versions get the plain ``--requeue``.
* Avoiding a failed node after a requeue: ``scontrol update JobId=J ExcNodeList=N`` on the requeued
  (pending) job. Every version this supports (22.05 on) takes it for a pending job; Slurm refuses it for a
  running one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from . import commands as sc

Version = tuple[int, int, int]
VERSION_RE = re.compile(r"^\s*slurm(?:-wlm)?\s+(\d{1,4})\.(\d{1,2})(?:\.(\d{1,3}))?", re.IGNORECASE)
EXPEDITE = (25, 11, 0)  # sbatch --requeue=expedite


def parse_version(text: str) -> Version | None:
    """``slurm 22.05.8`` -> (22, 5, 8); None for anything else (a pre-release suffix is ignored)."""
    m = VERSION_RE.match(text or "")
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@functools.lru_cache(maxsize=1)
def slurm_version() -> Version | None:
    """This machine's Slurm (asked once), or None when neither command answers."""
    for argv in (["sinfo", "--version"], ["scontrol", "--version"]):
        try:
            found = parse_version(sc.run(argv))
        except sc.SlurmError:
            continue
        if found is not None:
            return found
    return None


def requeue_option(requeue: bool, version: Version | None) -> str:
    """sbatch's requeue option: ``--requeue=expedite`` where the version has it, else ``--requeue``."""
    if not requeue:
        return "--no-requeue"
    return "--requeue=expedite" if version is not None and version >= EXPEDITE else "--requeue"


def avoid_nodes_argv(job_id: str, nodes: Sequence[str]) -> list[str]:
    """The requeued (pending) job's next allocation leaves ``nodes`` out (22.05 and later)."""
    return ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"]
