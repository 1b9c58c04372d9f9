"""What moves files at the boundaries of attempts: the hand-over at each attempt's end (complete logs;
after the run's last attempt the chief's checkpoint), the backup sync before a restart, and the gather
summary in result.json.

Which kind a job gets is decided once, from the backend (``Backend.transfers``): nodes reachable for
helper commands get ``ChannelTransfers``; nodes out of reach (pods: every line came through the API,
checkpoints live on the volume) get ``NoTransfers``, which only closes the attempt's channels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..events import kinds as ev
from ..transfer.state import GatherState, Totals

if TYPE_CHECKING:
    from ..plan import Plan
    from ..supervise import Supervisor
    from .context import RunContext


class Transfers(Protocol):
    def attempt_started(self, plan: Plan, attempt: int) -> None: ...

    def after_attempt(self, sup: Supervisor, attempt: int, *, final: bool) -> None: ...

    def before_restart(self, plan: Plan | None = None) -> None: ...

    def summarize(self) -> None: ...


class NoTransfers:
    def __init__(self, job: RunContext) -> None:
        self.job = job

    def attempt_started(self, plan: Plan, attempt: int) -> None:
        return None

    def after_attempt(self, sup: Supervisor, attempt: int, *, final: bool) -> None:
        for s in sup.sessions.values():
            s.close()
        report_unconfirmed(self.job, sup)

    def before_restart(self, plan: Plan | None = None) -> None:
        return None

    def summarize(self) -> None:
        return None


class ChannelTransfers:
    """Over the tasks' own channels and the backend's connections; what every attempt brought back is
    merged into result.json's ``gather``."""

    def __init__(self, job: RunContext) -> None:
        self.job = job
        self.state = GatherState.load(job.rundir.gather_state_json)
        self.totals = Totals()
        self.logs: dict[str, str] = {}
        self.checkpoints: dict[str, Any] | None = None
        self.attempts = 0
        self.keeper = None
        if not job.plan.common.backup_shared:  # local disks: the chief's backup is copied off its host
            from ..transfer.backupcopy import CopyStore
            from ..transfer.backupkeep import BackupKeeper

            self.keeper = BackupKeeper(
                CopyStore(job.rundir.backup_copies),
                lambda task: job.backend.connection(task),  # asked on each pass: a connection may be replaced
                job.spec.restart.backup_copy_interval_s,
            )

    def attempt_started(self, plan: Plan, attempt: int) -> None:
        """Copy each new save of this attempt's chief off its host while the attempt runs (a thread):
        where the backend has a helper connection to the chief's node (the SSH fleet; not Slurm's
        connect-back tasks, whose backup belongs on shared storage)."""
        find = getattr(self.job.backend, "connection", None)  # test doubles may lack it
        if self.keeper is not None and find is not None and find(str(plan.chief.task)) is not None:
            self.keeper.start(plan, attempt)

    def _copied(self) -> None:
        if self.keeper is not None:
            for e in self.keeper.drain():
                self.job.bus.emit(e)

    def after_attempt(self, sup: Supervisor, attempt: int, *, final: bool) -> None:
        """Complete this attempt's logs, and after the final attempt bring the chief's checkpoint
        (Ctrl-C now: stop after the current file; twice: abort)."""
        from ..transfer.handover import hand_over

        job = self.job
        if self.keeper is not None:
            self.keeper.stop()
            self._copied()
            if not self.keeper.copies and self.keeper.problem:
                job.bus.emit(
                    ev.JobWarning(message=f"the chief's backup was not copied off its host: {self.keeper.problem}")
                )
        fetch = job.opts.gather
        self.attempts = attempt + 1
        if final:
            job.stop_live()  # the gather's progress bar and the summary print below it
            if fetch:
                job.bus.emit(ev.GatherStarted(attempts=attempt + 1))
        job.logs.flush()
        base = job.interrupt.count
        checkpoint = final and fetch and job.spec.checkpoint.gather
        done = hand_over(
            list(sup.sessions.values()),
            job.rundir,
            job.bus,
            self.state,
            job.logs.write,
            attempt=attempt,
            fetch=fetch,
            checkpoint=checkpoint,
            stop=lambda: job.interrupt.count - base,
        )
        self.totals.merge(done.totals)
        self.logs.update(done.logs)
        if checkpoint and done.checkpoints is not None and "why" in done.checkpoints:
            done.checkpoints = self._fallback(sup, done.checkpoints, lambda: job.interrupt.count - base)
        self.checkpoints = done.checkpoints or self.checkpoints
        if done.totals.interrupted:
            job.result.gather_interrupted = job.interrupt.signum
        report_unconfirmed(job, sup)

    def _fallback(self, sup: Supervisor, summary: dict[str, Any], stop: Callable[[], int]) -> dict[str, Any]:
        """The chief's checkpoint did not come over its channel (``summary["why"]``): fetched over a
        helper connection where the backend has one, else an error in result.json's ``gather`` says why.
        Never silent: a succeeded run without its checkpoint and without a word was issue h29."""
        from ..transfer.gather import gather_checkpoint

        job, why = self.job, summary.pop("why")
        chief = next((s for s in sup.sessions.values() if s.task == summary["task"]), None)
        find = getattr(job.backend, "connection", None)
        conn = find(summary["task"]) if find is not None and chief is not None else None
        if chief is None or conn is None or not conn.is_alive():
            self.totals.errors.append(
                f"{summary['task']}: checkpoint not gathered ({why}; no connection to fetch it over); "
                "run `tfcluster gather RUN`"
            )
            return {**summary, "not_handed_over": why}
        job.bus.emit(
            ev.JobWarning(
                task=chief.task,
                host=chief.host,
                message=f"{chief.task}'s checkpoint was not handed over ({why}): fetched over a new connection",
            )
        )
        got = gather_checkpoint(chief.node, conn, job.rundir, self.state, self.totals, stop)
        return {**got, "not_handed_over": why}

    def before_restart(self, plan: Plan | None = None) -> None:
        """Every task of the next attempt's ``plan`` (default: the job's; a new plan after a host is lost)
        must restore from the newest backup: the last save of the chief that ran is copied off its host
        if it still answers, then every task is seeded from the newest complete copy
        (``transfer.seed_backups``), whichever host is gone; where storage is shared nothing moves."""
        from ..transfer import seed_backups

        job = self.job
        plan = plan or job.plan
        if self.keeper is not None:
            from ..transfer.backupkeep import CATCH_UP_TIMEOUT_S

            self.keeper.copy_once(CATCH_UP_TIMEOUT_S)
            self._copied()
        found = {str(n.task): job.backend.connection(str(n.task)) for n in plan.nodes}
        try:
            seed_backups(
                plan, {t: c for t, c in found.items() if c is not None}, self.keeper and self.keeper.store, job.bus
            )
        except Exception as exc:  # the restart still happens; Keras then starts those tasks from scratch
            job.bus.emit(ev.JobWarning(message=f"could not copy the chief's backup to the other tasks: {exc}"))

    def summarize(self) -> None:
        from ..transfer.gather import summarize

        job = self.job
        if not job.opts.gather or not self.attempts:
            return
        with contextlib.suppress(OSError):
            self.state.save()
        job.result.gather = summarize(self.totals, self.logs, self.checkpoints, job.rundir, job.bus)
        if self.totals.errors:
            job.result.gather_error = "; ".join(self.totals.errors[:5])


def report_unconfirmed(job: RunContext, sup: Supervisor) -> None:
    """Every host whose node did not confirm, as the attempt's channels closed (in parallel, bounded:
    ``TaskSession.close``), that the task's processes and its worker_entry are gone: one warning each."""
    for s in sup.sessions.values():
        if s.exit_confirmed is False:
            why = "it never reported the task's end" if s.exit is None else "its worker_entry did not exit in time"
            job.bus.emit(
                ev.ExitUnconfirmed(
                    task=s.task,
                    host=s.host,
                    message=(
                        f"{s.host} did not confirm that {s.task}'s processes are gone ({why}); they may still run there: "
                        f"check the host (worker_entry stops them when it notices the launcher is gone)"
                    ),
                )
            )


def transfers_for(job: RunContext) -> Transfers:
    make: Callable[[RunContext], Transfers] = ChannelTransfers if job.backend.transfers else NoTransfers
    return make(job)
