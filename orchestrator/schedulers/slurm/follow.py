"""Follow a submitted Slurm run from the login node, as if its supervisor ran here.

The supervisor runs inside the allocation and writes the run directory (shared storage); this prints
what it writes: every task's lines with their ``[task host]`` prefix — a line several tasks printed
within the window once, with the set of its tasks, and TensorFlow's known chatter hidden, as on the
launcher's console (``sinks.collapse.ConsoleLines``, the one implementation; ``all_output``: every
line as it comes) —, the events the supervisor's console would show, the live table on a terminal, and Slurm's own view of the job (pending and why,
running where, requeued). It ends when result.json appears — or, when the job is gone without one,
after writing it (``views.slurm.finalize``). Ctrl-C asks whether to cancel the job or detach (``ask``;
without a terminal: cancel); a second Ctrl-C after cancelling scancels the whole job.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

from ...events import EventBus, parse_events
from ...events.kinds import JobWarning
from ...plan import Plan
from ...runs import RunDir, json_objects
from ...runs.tail import Tail
from ...sinks import ConsoleSink, EventFileSink, use_color
from ...sinks.collapse import ConsoleLines
from ...views.logs import LogQuery
from . import commands as sc
from .avoid import RequeueWatch, avoid_failed
from .commands import SlurmError
from .handle import cancel, current_job, finalize, job_info, scancel_checked
from .private_spec import remove_private_spec

POLL_S = 0.2
SLURM_POLL_S = 1.0
JOB_END_WAIT_S = 20.0  # after result.json: how long to wait for Slurm to end the job
#: A job waiting for another allocation after Slurm requeued it.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


class Follower:
    def __init__(
        self,
        run: RunDir,
        plan: Plan,
        *,
        live: bool = False,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        ask: Callable[[], str] | None = None,
        all_output: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run = run
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = use_color(self.out)
        self.query: Any = LogQuery()  # ``parts(line, color)``: a task's line as shown, or None (``--quiet``)
        collapse = not all_output and len(plan.nodes) > 1  # one task: nothing to wait for
        self.lines = ConsoleLines(self._echo, collapse=collapse, show_noise=all_output, clock=clock)
        self.console = ConsoleSink(stream=self.err)
        self.logs = Tail(run.combined_log)
        self.events = Tail(run.events_jsonl)
        self.ask = ask
        self.live: Any = None
        if live:
            from ..sinks.live import LiveTable

            self.live = LiveTable(plan)
        self.last_slurm: tuple[str, str] | None = None
        self.requeue = RequeueWatch()
        self.cancelled = False

    def note(self, text: str) -> None:
        self.err.write(f"tfcluster: {text}\n")
        self.err.flush()

    def _echo(self, text: bytes) -> None:
        """Console lines (whole, newline-ended): above the live table when it shows, else on stdout."""
        if self.live is not None and self.live.active:
            self.live.print_log(text)
        else:
            self.out.write(text.decode("utf-8", "replace"))

    def _pump(self) -> None:
        for raw in self.logs.lines():
            parts = self.query.parts(raw.decode("utf-8", "replace"), self.color)
            if parts is None:
                continue
            task, prefix, body = parts
            if task is None:  # a launcher note (an attempt begins): after every task line before it
                self.lines.close()
                self._echo(f"{prefix}{body}\n".encode())
            else:
                self.lines.add(task, prefix.encode(), [body.encode()])
        self.lines.flush()  # the lines held for their window
        self.out.flush()
        for ev in parse_events(json_objects(self.events.lines())):  # a damaged line is skipped, never shown raw
            self.console.handle(ev)

    def _poll_slurm(self) -> bool:
        """Print Slurm's view when it changes; True when the job is gone (no more allocations)."""
        info = job_info(self.run)
        if info is None:
            return False
        key = (info.state, info.reason if info.state == "PENDING" else info.nodes)
        if key != self.last_slurm:
            self.last_slurm = key
            where = (
                f" ({info.reason})"
                if info.state == "PENDING" and info.reason
                else (f" on {info.nodes}" if info.nodes else "")
            )
            self.note(f"slurm job {info.job_id} {info.state}{where}")
        lost = self.requeue.see(info.state, info.nodes)
        if lost:
            self._avoid_failed(info.job_id, lost)
        if self.live is not None:
            status = self.run.read_json(self.run.status_json)
            if isinstance(status, dict):
                if info.state in ("PENDING", "REQUEUED"):
                    status = {**status, "state": f"pending in Slurm ({info.reason or info.state})"}
                self.live.update(status)
        return not info.active

    def follow(self) -> dict[str, Any] | None:
        """Until the run ends: its result.json; None when the user detached."""
        if self.live is not None:
            self.live.start()
        next_poll = 0.0
        try:
            while True:
                try:
                    finished = self.run.is_finished()
                    self._pump()
                    if finished:
                        self._wait_job_end()
                        break
                    if time.monotonic() >= next_poll:
                        next_poll = time.monotonic() + SLURM_POLL_S
                        if self._poll_slurm():
                            finalize(self.run)
                            self._pump()
                            break
                    time.sleep(POLL_S)
                except KeyboardInterrupt:
                    if not self._interrupted():
                        return None
        finally:
            self.lines.close()  # what is still held: the run's last lines
            self.out.flush()
            if self.live is not None:
                self.live.stop()
        return self.run.read_json(self.run.result_json)

    def _wait_job_end(self) -> None:
        """result.json is the supervisor's last act; wait (bounded) until Slurm has let the job go too,
        so that once ``launch`` returns the job is gone from squeue, as after ``srun``. A job Slurm
        requeued although the run is done (a preemption in the last epoch, whose tasks completed during
        the stop) would take an allocation for nothing: it is cancelled, and the run says so."""
        job = current_job(self.run)
        if not job:
            return
        deadline = time.monotonic() + JOB_END_WAIT_S
        try:
            info = sc.job_info(job)
            while info.active and time.monotonic() < deadline:
                if info.state in REQUEUED_STATES:
                    self._cancel_requeued(job, info.state)
                    info = sc.wait_gone(job, max(1.0, deadline - time.monotonic()))
                    break
                time.sleep(0.5)
                info = sc.job_info(job)
        except (SlurmError, KeyboardInterrupt):
            return
        if info.active:
            self.note(f"slurm job {job} is still {info.state} after {JOB_END_WAIT_S:g}s; the run itself has ended")

    def _avoid_failed(self, job: str, allocation: list[str]) -> None:
        """Slurm requeued the job: the nodes of the allocation it lost that failed are left out of the
        next one (``avoid``), said on the console and in the run's events (no supervisor runs now)."""
        try:
            added = avoid_failed(job, allocation)
        except SlurmError as exc:
            self._warn(f"Slurm requeued job {job}; could not ask it to avoid the failed nodes: {exc}")
            return
        if added:
            self._warn(
                f"Slurm requeued job {job} after node {', '.join(added)} failed: the next allocation leaves "
                f"{'it' if len(added) == 1 else 'them'} out (scontrol update ExcNodeList)"
            )

    def _warn(self, why: str) -> None:
        self.note(why)
        bus = EventBus([EventFileSink(self.run.events_jsonl)])  # the supervisor is gone: the run's one writer now
        try:
            bus.emit(JobWarning(message=why))
        finally:
            bus.close()

    def _cancel_requeued(self, job: str, state: str) -> None:
        why = (
            f"cancelled Slurm job {job}: Slurm requeued it ({state}), but the run is done "
            "(it would take an allocation for nothing)"
        )
        try:
            scancel_checked(self.run, job)
            remove_private_spec(self.run)  # no allocation will run it again: the run's credentials go
        except SlurmError as exc:
            why = f"Slurm job {job} was requeued ({state}) although the run is done, and could not be cancelled: {exc}"
        self._warn(why)

    def _interrupted(self) -> bool:
        """Ctrl-C: cancel (keep following the teardown) or detach (False)."""
        if self.live is not None:
            self.live.stop()
        job = current_job(self.run)
        if self.cancelled:
            self.note(f"scancel of the whole job {job}")
            try:
                if job:
                    scancel_checked(self.run, job)
            except SlurmError as exc:
                self.note(str(exc))
            return True
        choice = self.ask() if self.ask is not None else "c"
        if choice == "d":
            self.note(
                f"detached; Slurm job {job} keeps running. Follow it with `tfcluster logs {self.run.path} -f`, "
                f"`tfcluster status {self.run.path}`; stop it with `tfcluster stop {self.run.path}`"
            )
            return False
        self.cancelled = True
        self.note(cancel(self.run, signal_name="SIGINT", by="Ctrl-C on the follower") + " (Ctrl-C again: scancel now)")
        if self.live is not None:
            self.live.start()
        return True


def ask_cancel_or_detach(stdin: IO[str] | None = None) -> str:
    """The Ctrl-C question; "c" (cancel) without a terminal or without an answer."""
    stdin = stdin or sys.stdin
    if not stdin.isatty():
        return "c"
    try:
        answer = input("\ntfcluster: cancel the Slurm job (c) or detach and leave it running (d)? [c/d] ")
    except (EOFError, KeyboardInterrupt):
        return "c"
    return "d" if answer.strip().lower().startswith("d") else "c"
