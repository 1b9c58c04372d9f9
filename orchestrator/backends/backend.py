"""The backend seam: the one place that decides how tasks reach their nodes and how bytes come back.

The supervisor asks a backend to start tasks and gets ``Channel``s back, delivered asynchronously as
they come up (``start_all``): over SSH each is an exec channel opened by the launcher; a scheduler
backend (Slurm, Kubernetes) has the scheduler start worker_entry, which connects back to the
supervisor over TCP with a per-run secret (``backends.tcp``). Either way the supervisor sees the same
``Channel`` contract and never knows which.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from worker_entry.protocol import NodeConfig

from ..core.diagnostics import Diagnostic
from ..plan import NodePlan
from .base import Channel, Connection
from .refusals import Refusals

#: start_all's callback: (task, its channel) or (task, why it could not start).
Deliver = Callable[[str, "Channel | BaseException"], None]


@dataclass(frozen=True)
class Placement:
    """Where a task's last incarnation ran, as its node said in its hello: what a scheduler needs to
    start it again at the same place (its TF server's endpoint, the scheduler's node name)."""

    tf_endpoint: str | None = None
    node_name: str | None = None


class Backend(abc.ABC):
    """How the tasks of one plan are started and reached."""

    name: str = "backend"
    #: ``connection()`` can run helper commands on the nodes and the task channels take commands after
    #: the task ended: the hand-over, backup sync and gather apply (``job.transfers`` reads it, once).
    #: A backend whose nodes are out of reach (Kubernetes: logs come through the API) sets it False.
    transfers: bool = True
    #: ``connect`` opens something per node (SSH sessions), so the job reports how long it took; a
    #: backend whose nodes dial back has nothing to connect to before the tasks start.
    reaches_nodes: bool = True
    #: What the backend's own last-resort teardown had to do (the job reports each as a warning).
    notes: Sequence[str] = ()
    #: ``start_all`` may be called again during an attempt for one task (a parameter-server worker
    #: restarted in place). A scheduler that starts all tasks as one step cannot.
    restarts_tasks: bool = False
    #: The scheduler itself starts a failed sidecar (evaluator) again, whatever the launcher does
    #: (Kubernetes: its Job ignores the failure and puts a new pod in its place); the supervisor then
    #: follows the new one with ``restart_task``, as a restart, up to ``restart.max_task_restarts``.
    replaces_sidecars: bool = False
    #: Descriptors one task's channel holds in the launcher (``limits.needed``): an SSH session's
    #: transport socket and its channel's pipe; a node that dials back, one socket.
    fds_per_task: int = 3

    def bind_run(self, run_dir: Path) -> None:
        """The run directory, once it exists: where a backend records what it created (scheduler
        objects, pod states) for ``status`` and ``stop``. Default: nothing to record."""
        return None

    def bind_events(self, emit: Callable[[object], None]) -> None:
        """The run's event bus (``EventBus.emit``): what a backend refuses as it happens (a forged pod)
        is reported there. Default: nothing to report."""
        return None

    @abc.abstractmethod
    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        """Make ``nodes`` reachable (idempotent: nodes already reachable are kept). Returns one
        diagnostic per node that is not; an empty list means every node is ready."""

    @abc.abstractmethod
    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        """Bring every task up in the background; ``deliver`` gets each task's channel (or why it could
        not start) as soon as it is there. Returns the thread doing it (joined by the caller if it likes)."""

    def restart_task(self, node: NodePlan, config: NodeConfig, deliver: Deliver, placement: Placement) -> None:
        """Start one task again, alone, in place, during the attempt (``restarts_tasks``); ``config``
        carries its full TF_CONFIG. Its channel (or why not) goes to ``deliver``."""
        self.start_all([(node, config)], deliver)

    def abandon_restart(self, task: str) -> None:
        """The supervisor gave up on ``task``'s restart before its channel came (default: nothing)."""
        return None

    def connection(self, task: str) -> Connection | None:
        """A connection for helper commands on this task's node (transfers), or None."""
        return None

    def alive(self, task: str) -> bool:
        """Can this task's node still be reached (without waiting for a timeout)?"""
        conn = self.connection(task)
        return conn is not None and conn.is_alive()

    def refusals(self) -> Refusals | None:
        """Connections refused so far (a connect-back port anyone can reach), or None where nothing
        dials in. The supervisor reports them (events, status)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection; idempotent."""


class PerTaskBackend(Backend):
    """A backend that starts each task on its own (the SSH fleet): ``start_all`` runs ``start`` for every
    task in parallel, so one slow host delays only itself."""

    restarts_tasks = True

    @abc.abstractmethod
    def start(self, node: NodePlan, config: NodeConfig) -> Channel:
        """Start worker_entry for one task and hand it its config; raises OSError on failure."""

    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        def one(item: tuple[NodePlan, NodeConfig]) -> None:
            node, config = item
            try:
                chan = self.start(node, config)
            except Exception as exc:  # per task, never a crash of the launcher
                deliver(str(node.task), exc)
            else:
                deliver(str(node.task), chan)

        def run() -> None:
            with ThreadPoolExecutor(max_workers=max(1, min(64, len(starts)))) as pool:
                list(pool.map(one, starts))

        thread = threading.Thread(target=run, name=f"{self.name}-start", daemon=True)
        thread.start()
        return thread
