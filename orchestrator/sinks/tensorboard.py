"""TensorBoard scalars of what tfcluster measures, beside the user's own curves.

``RUN/tensorboard/`` (or ``DIR/tfcluster/<run id>/`` with ``launch --tensorboard DIR`` or the spec's
``tensorboard.dir``) holds one TensorBoard *run* per task (``worker-0``, ...) with the same tags, so
TensorBoard draws the workers on one chart, and a ``job`` run: per task the step time and its split,
steps/s and examples/s, straggler scores, CPU, RSS, the host's run-queue delay and throttling, per GPU
utilisation, SM clock, power, temperature and memory; for the job its steps/s, examples/s, running
tasks and, at the end, goodput (``views.tensorboard``). Every point is keyed by the task's training
step (counted on across restarts, so a curve never goes back) and by its wall time, so
``tensorboard --logdir RUN`` shows them against steps or time, beside the loss curves. An evaluator's
evaluations are ``eval/<metric>`` of its run, at the training step of the weights it evaluated: one
point per ``evaluation`` event (the sink is on the event bus), however close together they come.

Fed by the records the figures get (heartbeats.jsonl's heartbeats and step-clock windows: steps, CPU,
RSS, the host, the GPUs, the step split) and by the live status snapshots: each task's steps/s,
examples/s and loss are the supervisor's own figures as its last snapshot showed them (``figures``
has one owner: no second ``Figures`` here, which at 4,096 tasks cost the writer thread a quarter of its
CPU and let it fall thousands of records behind), its scores, the job's rates. The supervisor's cost
per record is one append to a bounded deque (a full one drops and counts), with no wake-up: the
thread takes what came every ``DRAIN_S`` in one batch (a ``queue.Queue`` put woke it per record:
~9 % of the launcher's GIL time at 1,024 tasks, docs/benchmarks.md §11); it builds
and writes the events, each task's heartbeats at most one per ``min_interval_s`` and its step-clock
windows at most one per ``min_interval_s`` too (1 s, longer for jobs of more than ``TASKS_PER_SECOND``
tasks: 64 s at 4,096; the writes stay under ~128 events/s whatever the size, the first points included:
the k-th task's first waits k // ``TASKS_PER_SECOND`` s). Directories are 0700,
files 0600, as many open at once as the open-file limit has room for (``backends.limits.open_files``; at
least ``OPEN_EVENT_FILES``; ``tbfiles``: the event files and why tensorboardX does not write them).
"""

from __future__ import annotations

import importlib.util
import math
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.limits import OPEN_EVENT_FILES
from ..events.base import BaseEvent
from ..events.kinds import Evaluation
from ..runs import RunDir, read_jsonl
from .tbfiles import EventFiles, Point, private_dirs
from .tbtags import GPU_TAGS, HOST_TAGS, SPLIT_TAGS

QUEUE_SIZE = 8192  # records waiting for the writer thread (beyond: dropped, counted)
DRAIN_S = 0.25  # the writer thread takes what was queued this often (or at close): one wake-up, many records
TASKS_PER_SECOND = 64  # heartbeat events written per second at most, over all tasks
JOB_RUN = "job"


def run_name(task: str) -> str:
    """A task's TensorBoard run (a directory name): ``worker:0`` -> ``worker-0``."""
    return task.replace(":", "-").replace("/", "-")


def _finite(x: Any) -> float | None:
    if type(x) is float:  # (JSON's own type first: once a record, every record)
        return x if -math.inf < x < math.inf else None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


@dataclass(slots=True)
class _Task:
    attempt: int = 0
    offset: int = 0  # steps of earlier attempts
    steps: int = 0  # this attempt's
    written: float = -math.inf  # wall time of the last heartbeat event
    split_written: float = -math.inf  # wall time of the last step-clock window's event
    scores_written: float = -math.inf  # wall time of the last straggler scores' event
    scores: tuple[Any, ...] = ()
    #: steps/s, examples/s and loss: the supervisor's live figures, from its last status snapshot
    rates: tuple[Any, Any, Any] = (None, None, None)

    @property
    def step(self) -> int:
        return self.offset + self.steps


@dataclass
class Scalars:
    """Records and status snapshots -> points. Pure (tests feed it), owned by the writer thread."""

    min_interval_s: float = 1.0
    tasks: dict[str, _Task] = field(default_factory=dict)
    #: tasks whose first heartbeat came: the k-th's first point waits k // TASKS_PER_SECOND s (``record``)
    firsts: int = 0

    def record(self, task: str, rec: Mapping[str, Any]) -> list[Point]:
        """A heartbeats.jsonl record of ``task``: a heartbeat (at most one point per ``min_interval_s``)
        or a step-clock window (at most one point per ``min_interval_s`` each)."""
        t = self.tasks.get(task)
        if t is None:  # (not setdefault: a _Task built per record)
            t = self.tasks[task] = _Task()
        get = rec.get
        wall = _finite(get("ts")) or time.time()
        if t.written == -math.inf == t.split_written:
            # Its first record. The first TASKS_PER_SECOND tasks' first points are written at once, the
            # next ones a second later each (every task's first heartbeat comes within a second: 4,096
            # first event files opened at once held the writer back for seconds, and its queue overflowed)
            t.written = t.split_written = wall - self.min_interval_s + self.firsts // TASKS_PER_SECOND
            self.firsts += 1
        attempt = get("attempt")
        if attempt != t.attempt and type(attempt) is int:
            t.attempt, t.offset, t.steps = attempt, t.offset + t.steps, 0
        if get("kind") == "profile":
            if wall - t.split_written < self.min_interval_s:
                return []
            t.split_written = wall
            values = {tag: v for k, tag in SPLIT_TAGS.items() if (v := _finite(rec.get(k))) is not None}
            return [Point(run_name(task), t.step, wall, values)] if values else []
        prog = get("progress")
        if (type(prog) is dict or isinstance(prog, Mapping)) and prog.get("phase", "train") == "train":
            steps = prog.get("steps")
            if type(steps) is int and steps >= t.steps:
                t.steps = steps
        if wall - t.written < self.min_interval_s:
            return []
        t.written = wall
        values = self._heartbeat(t, rec, prog)
        return [Point(run_name(task), t.step, wall, values)] if values else []

    @staticmethod
    def _heartbeat(t: _Task, rec: Mapping[str, Any], prog: Any) -> dict[str, float]:
        out: dict[str, float] = {}

        def put(tag: str, value: Any, scale: float = 1.0) -> None:
            if (v := _finite(value)) is not None:
                out[tag] = v * scale

        put("throughput/steps_per_s", t.rates[0])
        put("throughput/examples_per_s", t.rates[1])
        put("train/loss", t.rates[2])
        if isinstance(prog, Mapping):
            put("step/time_ms", prog.get("step_time_s"), 1000.0)
        put("host/cpu_pct", rec.get("cpu_pct"))
        put("host/rss_mb", rec.get("rss_mb"))
        host = rec.get("host")
        if isinstance(host, Mapping):
            for key, tag in HOST_TAGS.items():
                put(tag, host.get(key))
        gpus = rec.get("gpus")
        for g in gpus if isinstance(gpus, list) else []:
            if isinstance(g, Mapping) and isinstance(g.get("index"), int):
                for key, name in GPU_TAGS.items():
                    put(f"gpu/{g['index']}/{name}", g.get(key))
        return out

    def status(self, status: Mapping[str, Any]) -> list[Point]:
        """The live status: each task's rates and loss (kept for its next heartbeat point), its straggler
        scores when a round changed them, the job's rates."""
        wall = _finite(status.get("updated")) or time.time()
        tasks = status.get("tasks") if isinstance(status.get("tasks"), Mapping) else {}
        points = []
        running = 0
        known_tasks = self.tasks
        for task, st in tasks.items():  # (every task, every second: JSON's dict tested first)
            if type(st) is not dict and not isinstance(st, Mapping):
                continue
            get = st.get
            if get("state") == "running":
                running += 1
            rates = (get("steps_per_s"), get("examples_per_s"), get("loss"))
            if get("relative_score") is None:
                if (known := known_tasks.get(task)) is not None:  # a task is known from its first record
                    known.rates = rates
                continue
            t = known_tasks.get(task)
            if t is None:  # (not setdefault: a _Task built per task per second, to be thrown away)
                t = known_tasks[task] = _Task()
            t.rates = rates
            scores = (st.get("relative_score"), st.get("individual_score"), bool(st.get("straggler")))
            if scores == t.scores:
                continue
            # a large job's scores at most once per interval too (every round changes every task's: 4,096
            # events every 5 s); a task named or cleared as a straggler at once, whatever the size
            named = bool(t.scores) and t.scores[2]
            if self.min_interval_s > 1.0 and wall - t.scores_written < self.min_interval_s and scores[2] == named:
                continue
            t.scores, t.scores_written = scores, wall
            values = {"straggler/named": 1.0 if scores[2] else 0.0}
            for tag, v in (("straggler/relative_score", scores[0]), ("straggler/individual_score", scores[1])):
                if (f := _finite(v)) is not None:
                    values[tag] = f
            points.append(Point(run_name(task), t.step, wall, values))
        rates = status.get("throughput") if isinstance(status.get("throughput"), Mapping) else {}
        job = {
            tag: v
            for key, tag in (("steps_per_s", "throughput/steps_per_s"), ("examples_per_s", "throughput/examples_per_s"))
            if (v := _finite(rates.get(key))) is not None
        }
        job["tasks/running"] = float(running)
        if self.tasks:  # from the first record on (a job done before its first heartbeat writes nothing)
            points.append(Point(JOB_RUN, self.job_step(), wall, job))
        return points

    def evaluation(self, event: Evaluation) -> list[Point]:
        """An evaluator's evaluation (``eval/<metric>`` at the training step of the weights it evaluated;
        the job's step when it did not say)."""
        if event.task is None:
            return []
        values = {f"eval/{k}": v for k, x in event.metrics.items() if (v := _finite(x)) is not None}
        step = event.step if isinstance(event.step, int) and not isinstance(event.step, bool) else self.job_step()
        return [Point(run_name(event.task), step, _finite(event.ts) or time.time(), values)] if values else []

    def job_step(self) -> int:
        """The job's training step: its furthest task's (every worker makes every step)."""
        return max((t.step for t in self.tasks.values()), default=0)


PENDING_POINTS = 10_000  # points held before the first training step (startup CPU, RSS), at most


class TensorBoardSink:
    """The live writer: ``write`` (heartbeats.jsonl's records), ``update`` (each status snapshot) and
    ``handle`` (the bus's events: evaluations) only queue; a thread turns them into events.
    ``problems`` says what went wrong (reported at close)."""

    def __init__(
        self,
        root: Path,
        tasks: Sequence[str],
        *,
        flush_s: float = 5.0,
        history: Path | None = None,
        open_files: int = OPEN_EVENT_FILES,
    ) -> None:
        if importlib.util.find_spec("tensorboardX") is None:
            raise ImportError("tensorboardX is not installed")
        self.root = root
        private_dirs(root)  # a directory we cannot write says so at the start
        # tensorboardX (and numpy) is imported by the thread, at the first point: not on the launch's path
        self.files: EventFiles | None = None
        self.open_files = open_files  # event files open at once (``backends.limits.open_files``)
        self.scalars = Scalars(min_interval_s=max(1.0, len(tasks) / TASKS_PER_SECOND))
        self.problems: list[str] = []
        self.dropped = 0  # records the queue had no room for
        self.dropped_points = 0  # points made and not written: the files' writes fell behind
        self._items: deque[tuple[Any, ...]] = deque()  # appended by the loop, taken by the thread (GIL-atomic)
        self._wake = threading.Event()  # set by close only
        self._flush_s = flush_s
        self._history = history  # heartbeats.jsonl of earlier allocations (a requeued run): steps go on from them
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tfcluster-tensorboard", daemon=True)
        self._thread.start()

    def write(self, task: str, record: dict[str, Any]) -> None:
        self._put((self.scalars.record, task, record))

    def update(self, status: dict[str, Any]) -> None:
        self._put((self.scalars.status, status))

    def handle(self, event: BaseEvent) -> None:
        if isinstance(event, Evaluation):
            self._put((self.scalars.evaluation, event))

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (for at most ``timeout_s``), close the files. Once: the bus closes its
        sinks and the run's outputs close it again."""
        if self._closing or not self._thread.is_alive():
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.problems.append(
                f"TensorBoard: the writer did not finish within {timeout_s:g} s; its last events may be missing"
            )
        if self.dropped:
            self.problems.append(f"TensorBoard: {self.dropped} records not written (the writer fell behind)")
        if self.dropped_points:
            self.problems.append(
                f"TensorBoard: {self.dropped_points} points not written (the files' writes fell behind)"
            )

    def _put(self, item: tuple[Any, ...]) -> None:
        if len(self._items) >= QUEUE_SIZE:
            self.dropped += 1
        else:
            self._items.append(item)

    def _run(self) -> None:
        flushed = time.monotonic()
        todo: deque[Point] = deque()  # points made, not written yet (a file being opened holds them up)
        pending: deque[Point] = deque(maxlen=PENDING_POINTS)
        try:
            if self._history is not None:  # already written by an earlier supervisor: only counted
                for rec in read_jsonl(self._history):
                    if isinstance(rec.get("task"), str):
                        self.scalars.record(rec["task"], rec)
            while True:
                stopping = self._wake.wait(min(DRAIN_S, self._flush_s))
                self._points(todo)
                while todo:
                    point = todo.popleft()
                    if self.files is None and self.scalars.job_step() == 0:
                        # before the first training step: held (a job that trains nothing writes no
                        # files, and does not pay tensorboardX's import: ~0.2 s of a core)
                        pending.append(point)
                        continue
                    self.files = self.files or EventFiles(self.root, open_files=self.open_files)
                    while pending:
                        self.files.add(pending.popleft())
                    self.files.add(point)
                    if self._items:
                        # records are made points between two writes: opening thousands of new event
                        # files (each syscall waits for the GIL on a busy launcher) took seconds, in
                        # which 4,096 tasks' records overflowed the queue; the points, ~128 a second, wait
                        self._points(todo)
                if stopping:
                    break
                if self.files is not None and time.monotonic() - flushed >= self._flush_s:
                    self.files.flush()
                    flushed = time.monotonic()
        except Exception as exc:  # a full disk, a bug: the job goes on without TensorBoard
            self.problems.append(f"TensorBoard: writing under {self.root} stopped: {exc!r}")
        finally:
            if self.files is not None:
                self.files.close()
                if failed := self.files.failed:
                    runs = f"{len(failed)} run{'s' if len(failed) > 1 else ''}"
                    first = next(iter(failed.values()))
                    self.problems.append(f"TensorBoard: the points of {runs} not written (the first: {first})")

    def _points(self, todo: deque[Point]) -> None:
        """Every record and snapshot queued so far, made points (in order) onto ``todo``."""
        items = self._items
        while items:
            item = items.popleft()  # (no star-unpacking: a list built per record)
            todo.extend(item[0](*item[1:]))
        while len(todo) > QUEUE_SIZE:  # writes slower than ~128 points a second for a long time (a slow disk)
            todo.popleft()
            self.dropped_points += 1


def tensorboard_root(run: RunDir, run_id: str, own_dir: str | None) -> Path:
    """Where a run's events go: RUN/tensorboard, or DIR/tfcluster/<run id> in the user's own log dir
    (``tensorboard --logdir DIR`` then shows them beside the user's runs, one run id apart from another)."""
    if own_dir:
        return Path(own_dir).expanduser() / "tfcluster" / run_id
    return run.tensorboard_dir


__all__ = ["EventFiles", "Point", "Scalars", "TensorBoardSink", "private_dirs", "run_name", "tensorboard_root"]
