"""What a scheduler adds to a running job, as hooks the job calls at fixed points of its one loop.

The job owns the sequence (records, connect, attempts, hand-overs, the end); a scheduler package
(``orchestrator/schedulers/<name>``) gives it a ``RunScheduling`` with its own policy and records. The
default adds nothing: the SSH fleet and Kubernetes run every attempt under one launcher, which sees
the run from its start to its end. Slurm overrides it: a run spans allocations, each with its own
supervisor, and an allocation can end under the job (time limit, preemption) — a requeue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plan import Plan
from ..spec import ClusterSpec
from .policy import AttemptPolicy, Decision, Members, RestartPolicy

if TYPE_CHECKING:
    from .context import RunContext


class RunScheduling:
    #: Signals that, like SIGINT/SIGTERM, interrupt the job (Slurm: SIGUSR2, the time-limit warning).
    signals: tuple[int, ...] = ()
    #: ``replan`` builds a plan without a host (issue 34): a host lost for good can leave the run.
    reshapes: bool = False

    def policy(self, spec: ClusterSpec) -> AttemptPolicy:
        """What follows each attempt."""
        return RestartPolicy(spec.restart.max_restarts)

    def open(self, job: RunContext) -> bool:
        """Before anything runs: the scheduler's own records; earlier attempts of the run go into
        ``job.result``. True when this continues a run whose files exist (spec, plan: not rewritten)."""
        return False

    def opened(self, job: RunContext) -> None:
        """After ``job_started``: the scheduler's events about where this share of the run runs."""
        return None

    def completed_earlier(self, job: RunContext) -> str | None:
        """Before connecting: why there is nothing left to run (the training already completed in an
        earlier share of the run), or None. The default: every run starts from its first attempt."""
        return None

    def settle(self, job: RunContext, decision: Decision) -> None:
        """After the last attempt, before the result is recorded: the scheduler's bookkeeping (which may
        still change ``job.result``)."""
        return None

    def replan(self, plan: Plan, members: Members) -> Plan | None:
        """The plan of a reshaped attempt (issue 34): ``members.hosts`` in this order, each with its tasks
        (``members.roles_of``: a spare takes the lost host's, a worker the lost chief), the spares left
        standing by; built by the scheduler's planner, so TF_CONFIG and the task indices are rebuilt.
        None: this scheduler cannot (its next attempt runs on the same plan, as before)."""
        return None

    def fixed_hosts(self) -> str | None:
        """Why this job can swap a lost host only for a spare, never run on fewer hosts; None: it can."""
        return None

    def hand_off(self, job: RunContext, decision: Decision) -> None:
        """Everything is recorded and the run files are closed; for ``Action.REQUEUE`` give the run to
        the scheduler's next allocation (events may still be emitted: the bus closes after this)."""
        return None
