"""What the supervisor reports: the live status snapshot, the final one, and the attempt's result. Pure.

A task's figures (steps, step time, rates, CPU) come from ``figures``: live ones while the job runs;
in the final snapshot of a finished run the whole run's, the same ``report`` computes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Set
from types import MappingProxyType
from typing import Any

from ..core.result import AttemptResult, Failure, TaskResult
from ..core.states import JobState, TaskState, interrupted_state
from ..events.evaluations import Evaluations
from ..events.kinds import Evaluation
from .figures import FIGURE_KEYS, Figures, TaskFigures, live_throughput
from .session import TaskSession

#: Live readings that say nothing about a finished task (taken during its teardown; and ``gpus``, its
#: last NVML sample, is not the GPU models ``report`` lists under that name; ``gpu_problems``, the monitor's
#: judgement of the last heartbeats — ``report`` judges the run's; the scores of the monitor's last round,
#: where ``report`` scores the run's windows): not in the final snapshot.
LIVE_ONLY = (
    "last_heartbeat_age_s",
    "proc_state",
    "rss_mb",
    "gpus",
    "gpu_problems",
    "relative_score",
    "individual_score",
)


def task_status(
    s: TaskSession,
    fig: TaskFigures | Mapping[str, Any],
    *,
    straggler: bool,
    now_wall: float,
    gpu_problems: list[dict[str, Any]] | None = None,
    score: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One task's live status; ``fig``: its live figures (``Figures.live_row``, or a ``TaskFigures``);
    ``gpu_problems``: its GPUs' problems as the monitor judged them last
    (``supervise.gpus``: the judgement report and the metrics use too), [] when none; ``score``: its
    straggler scores of the monitor's last round (relative: the fastest worker's own work per step / its
    own; individual: its best / now), when it had one; ``evaluation``: an evaluator's evaluations
    (``events.evaluations``: how many, the last one's metrics, checkpoint and step), when it made any.
    (One dict built in one go: the snapshot builds it for every task with news, every task every second.)"""
    hb = s.heartbeat
    ex = s.exit
    facts = s.facts
    wall = s.heartbeat_wall
    row = fig.to_dict() | {"epoch": fig.epoch} if isinstance(fig, TaskFigures) else fig
    entry = {
        "host": s.host,
        "hostname": facts.hostname if facts else None,
        "state": _STATE_VALUE[s.state],
        "pid": s.pid,
        "started": s.started_how is not None,
        "last_heartbeat_age_s": round(now_wall - wall, 1) if wall else None,
        "proc_state": hb.state if hb else None,
        "rss_mb": hb.rss_mb if hb else None,
        "gpus": [g.to_dict() for g in hb.gpus] if hb and hb.gpus else None,
        "epoch": row["epoch"],
        "steps": row["steps"],
        "step_time_s": row["step_time_s"],
        "steps_per_s": row["steps_per_s"],
        "examples_per_s": row["examples_per_s"],
        "cpu_pct": row["cpu_pct"],
        "loss": row["loss"],
        "exit_code": ex.code if ex else None,
        "signal": ex.signal_name if ex else None,
        "straggler": straggler,
        "gpu_problems": list(gpu_problems) if gpu_problems else [],
        "relative_score": score.get("relative") if score else None,
        "individual_score": score.get("individual") if score else None,
    }
    if s.restarts:  # restarted alone, in place (a parameter-server worker)
        entry["restarts"] = s.restarts
    if evaluation:
        entry["evaluation"] = dict(evaluation)
    return entry


_STATE_VALUE = {st: st.value for st in TaskState}  # (``Enum.value`` is a descriptor: 1 µs a task a second)


#: status.json lists every task: past this many tasks a snapshot is written less often than every second,
#: so the work of writing them stays bounded (~4,096 task entries a second) whatever the task count.
STATUS_TASKS_PER_S = 4096


def status_period(tasks: int) -> float:
    """Seconds between two live snapshots of a job of ``tasks`` tasks (1 s up to STATUS_TASKS_PER_S)."""
    return max(1.0, tasks / STATUS_TASKS_PER_S)


def refreshed(entry: Mapping[str, Any], s: TaskSession, row: Mapping[str, Any], now_wall: float) -> dict[str, Any]:
    """``entry`` (``task_status``'s of ``s``) with what a heartbeat or a step-clock window changes brought
    up to date: its figures (``row``) and its heartbeat's readings; the rest (the session's state, the
    monitor's judgements) as they were. The same dict ``task_status`` builds when only those changed,
    key order included, for a copy and ten stores instead of twenty-three look-ups."""
    hb = s.heartbeat
    wall = s.heartbeat_wall
    out = entry.copy()  # (a new dict: a published snapshot's entries are not changed under its readers)
    out.update(row)
    out["last_heartbeat_age_s"] = round(now_wall - wall, 1) if wall else None
    out["proc_state"] = hb.state if hb else None
    out["rss_mb"] = hb.rss_mb if hb else None
    out["gpus"] = [g.to_dict() for g in hb.gpus] if hb and hb.gpus else None
    return out


def _standing(s: TaskSession) -> tuple[Any, ...]:
    """What of ``s`` its entry shows besides its heartbeat and figures: when it is as it was at the
    entry's build, ``refreshed`` brings the entry up to date."""
    return (s.state, s.host, s.facts, s.pid, s.started_how, s.exit, s.restarts)


class Snapshots:
    """The live snapshot, built incrementally: a task's entry is rebuilt only when something arrived for
    it since the last snapshot (``touch``); the others keep theirs, with only their heartbeat's age
    brought up to date. At a thousand tasks a second's snapshot rebuilds the few that changed, not all.
    A touched task whose session stands as it did and whose judgements are unchanged (at 4,096 tasks:
    every task every second, for its heartbeat) gets its entry ``refreshed``, not built anew."""

    def __init__(
        self, sessions: Mapping[str, TaskSession], figures: Figures, evaluations: Evaluations | None = None
    ) -> None:
        self.sessions = sessions
        self.figures = figures
        self._entries: dict[str, dict[str, Any]] = {name: {} for name in sessions}  # in plan order
        self._dirty: set[str] = set(sessions)
        self._whole: set[str] = set()  # touched tasks whose judgements or evaluations changed: built anew
        self._standing: dict[str, tuple[Any, ...]] = {}  # each entry's session as of its build (``_standing``)
        self._live: dict[str, Mapping[str, Any]] = {}  # each task's live figures as of its entry: the job's rates
        figures.track_live()  # (each task's live row kept as its records come: ``Figures.live_row``)
        self._straggler: str | None = None
        self._judged: tuple[Any, Any] = (None, None)  # the GPU problems and scores the entries were built with
        # the run's evaluation events, folded (an evaluator's entry): the job's, across attempts, when it
        # passes them, so status counts what report lists
        self.evaluations = evaluations if evaluations is not None else Evaluations()

    def evaluated(self, event: Any) -> None:
        """An ``evaluation`` event was emitted: its task's entry shows it from the next snapshot on."""
        if isinstance(event, Evaluation) and event.task is not None:
            self.evaluations.add(event)
            self._dirty.add(event.task)
            self._whole.add(event.task)

    def touch(self, task: str | None = None) -> None:
        """``task`` changed (None: every task, e.g. a teardown changed them all)."""
        if task is None:
            self._dirty = set(self.sessions)
        else:
            self._dirty.add(task)

    def build(
        self,
        *,
        state: JobState,
        attempt: int,
        stopping_reason: str | None,
        straggler: str | None,
        gpu_problems: Mapping[str, list[dict[str, Any]]] | None = None,
        scores: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The snapshot; ``throughput``: the job's rates beside the tasks' (``figures.throughput``)."""
        now = time.time()
        gpu_problems = gpu_problems or {}
        scores = scores or _NO_SCORES  # (one object: `is` says the scores did not change)
        judged = self._whole
        if straggler != self._straggler:
            judged.update(t for t in (straggler, self._straggler) if t is not None)
            self._straggler = straggler
        # a GPU judgement is relative: a peer's heartbeat can change another task's problems; the scores
        # change once a round (a new dict): every entry is looked at only when either differs from last time
        if gpu_problems != self._judged[0]:
            judged.update(t for t, e in self._entries.items() if e and e.get("gpu_problems") != gpu_problems.get(t, []))
        if scores is not self._judged[1]:
            judged.update(t for t, e in self._entries.items() if e and _score_changed(e, scores.get(t)))
        self._judged = (gpu_problems, scores)
        sessions, entries, live, live_row = self.sessions, self._entries, self._live, self.figures.live_row
        last, dirty, standing = self.evaluations.last, self._dirty, self._standing
        dirty |= judged
        self._dirty, self._whole = set(), set()
        if len(entries) < len(sessions):  # (a task added to the sessions after the start)
            for name in sessions.keys() - entries.keys():
                entries[name] = {}
                dirty.add(name)
        for name, entry in entries.items():  # one pass: each task's session is read once a snapshot
            s = sessions[name]
            if name in dirty:
                live[name] = row = live_row(name)
                now_standing = _standing(s)
                if entry and name not in judged and standing.get(name) == now_standing:
                    entries[name] = refreshed(entry, s, row, now)
                    continue
                standing[name] = now_standing
                entries[name] = task_status(
                    s,
                    row,
                    straggler=straggler == name,
                    now_wall=now,
                    gpu_problems=gpu_problems.get(name),
                    score=scores.get(name),
                    evaluation=last(name),
                )
            else:
                wall = s.heartbeat_wall
                entry["last_heartbeat_age_s"] = round(now - wall, 1) if wall else None
        return {
            "state": state.value,
            "attempt": attempt,
            "updated": now,
            "stopping_reason": stopping_reason,
            "throughput": live_throughput(live.values()),
            "tasks": dict(self._entries),
        }


_NO_SCORES: Mapping[str, Mapping[str, Any]] = MappingProxyType({})


def _score_changed(entry: Mapping[str, Any], score: Mapping[str, Any] | None) -> bool:
    score = score or {}
    return entry.get("relative_score") != score.get("relative") or entry.get("individual_score") != score.get(
        "individual"
    )


def final_tasks(
    live: Mapping[str, Mapping[str, Any]], result: Mapping[str, Mapping[str, Any]], figures: Figures | None
) -> dict[str, dict[str, Any]]:
    """The tasks of a finished run's one final snapshot: what was last seen of each (host name, pid,
    whether it was the straggler), its outcome from the result (state, exit code, signal, reason), and its figures over the
    whole run (``figures.final()``: what ``report`` shows)."""
    whole = figures.final() if figures is not None else {}
    out = {}
    for name, res in result.items():
        seen = {k: v for k, v in (live.get(name) or {}).items() if k not in LIVE_ONLY and k not in FIGURE_KEYS}
        fig = whole.get(name, TaskFigures())
        out[name] = {**seen, **res, "epoch": fig.epoch, **fig.to_dict()}
    return out


def attempt_result(
    sessions: Iterable[TaskSession],
    *,
    attempt: int,
    failures: list[Failure],
    interrupted_by: int | None,
    started_ts: float,
    went: bool = True,
    bounded: bool = False,
    optional: Set[str] = frozenset(),
) -> AttemptResult:
    """The attempt's outcome; ``went``: the go was sent (a failure before it means nothing ran);
    ``bounded``: a bounded run stopped its tasks on purpose, or the training ended and the tasks that
    never end by themselves were stopped (stopped tasks are a success); ``optional``: tasks whose end
    does not decide the outcome (ps, parameter-server workers, the evaluator: their failures that
    matter are in ``failures``)."""
    done = (TaskState.SUCCEEDED, TaskState.STOPPED) if bounded else (TaskState.SUCCEEDED,)
    tasks = {}
    for s in sessions:
        ex = s.exit
        tasks[s.task] = TaskResult(
            task=s.task,
            host=s.host,
            state=s.state,
            exit_code=ex.code if ex else None,
            signal=ex.signal_name if ex else None,
            reason=ex.reason if ex else (s.violation and f"protocol error: {s.violation}"),
            started=s.started_how is not None,
        )
    if interrupted_by is not None:
        state = interrupted_state(interrupted_by)
    elif failures and failures[0].kind == "preflight":
        state = JobState.PREFLIGHT_FAILED
    elif failures and not went and failures[0].kind in ("spawn", "protocol"):
        state = JobState.START_FAILED
    elif failures or any(t.state not in done for t in tasks.values() if t.task not in optional):
        state = JobState.FAILED
    else:
        state = JobState.SUCCEEDED
    return AttemptResult(
        attempt=attempt,
        state=state,
        started_ts=started_ts,
        ended_ts=time.time(),
        tasks=tasks,
        failures=list(failures),
    )
