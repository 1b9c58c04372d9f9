"""Which host a check waited for (pure): when the check's deadline passes before its collective rounds end,
no task has figures, yet the host that held the others up is knowable by how far each one got.

Every node prints a phase line as it reaches each phase (``checkline.PHASES``: started, links, tensorflow,
strategy, joined, compute, allreduce). A host starved of CPU is still importing TensorFlow when the others
have made their strategy and wait in the first all-reduce for it; at the deadline none of them has a
figure. The *reference* phase is the furthest one that more than half of the tasks reached; the tasks
that did not reach it are the ones the others waited for, and only they are named ("did not finish
importing TensorFlow within 60 s; the others waited for it"). Where no such phase splits the tasks (every
task stopped at the same phase, or only a minority got further: with two hosts, one host's word against
the other's), every task without figures is named, as before. A node may lie about its own phase; a
minority of liars cannot get an honest host named, since the reference needs a majority behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker_entry.protocol.checkline import PHASES

#: what a task was doing after the phase it last reported (None: it never reported one)
DOING: dict[str | None, str] = {
    None: "starting its check (the interpreter, worker_entry)",
    "started": "its link rounds",
    "links": "importing TensorFlow",
    "tensorflow": "creating its MultiWorkerMirroredStrategy",
    "strategy": "joining the collective (its first all-reduce)",
    "joined": "the compute benchmark",
    "compute": "the all-reduce rounds",
    "allreduce": "the final barrier",
}
DONE = len(PHASES)  # a task with figures: past every phase


def behind(
    phases: Mapping[str, str | None], tasks: Sequence[str], done: Sequence[str] = ()
) -> tuple[str | None, list[str]]:
    """(the reference phase, the tasks that did not reach it), or (None, []) when nothing tells the tasks
    apart. ``phases``: each task's last reported phase; ``done``: the tasks that have figures."""
    reached = {t: DONE if t in done else (PHASES.index(p) if (p := phases.get(t)) in PHASES else -1) for t in tasks}
    for i in range(len(PHASES) - 1, -1, -1):
        if 2 * sum(v >= i for v in reached.values()) > len(tasks):
            late = [t for t in tasks if reached[t] < i]
            return (PHASES[i], late) if late else (None, [])
    return None, []


def late_what(host: str, task: str, last: str | None, ref: str, deadline_s: float | None, others: int) -> str:
    """The finding's text for a task the others waited for."""
    within = f" within {deadline_s:g} s" if deadline_s else ""
    return (
        f"no figures from {host} ({task}): it did not finish {DOING.get(last, 'its check')}{within}; the others "
        f"waited for it ({others} task(s) reached {ref!r}, it stopped after {last or 'nothing'!r})"
    )
