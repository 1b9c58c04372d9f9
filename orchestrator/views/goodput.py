"""Goodput: where a run's wall time went, as ML goodput measurements count it. Pure.

goodput = productive training time / wall time (job_started → the run's end). Every second of the wall
lands in exactly one category, so the categories add up to the wall:

- ``startup_s``: each attempt's start → its first training step (the first progress record: tracing
  and compiling the first steps included); attempt 0's also holds connecting and the preflight.
- training, first step → last step, split by the step clock's shares of a step (the median worker's,
  see ``split``): ``input_stall_s`` (waiting for the batch) and ``straggler_wait_s`` (waiting for the
  slowest worker inside the all-reduce) are parts of step time, so ``productive_s`` is the rest. When the
  slowest worker is late because of its input pipeline, the others' wait for it is input's cost: booked
  in ``input_stall_s``, and per worker in ``input_waits`` (issue 32: "how much did input cost me").
- ``redone_s``: per failed attempt, the training since its last backup (work the next attempt redoes).
- ``host_lost_s``: failure → the next attempt's start when that attempt runs on a new plan without the
  failed host (a ``reshaped`` event: a host lost for good, issue 34): teardown, the reshape, connecting.
- ``failure_s``: the same gap before a restart in place (teardown, reconnecting, copying the backup;
  for Slurm, the wait for the next allocation).
- ``teardown_s``: the final attempt's last step (or its failure) → its tasks' exit (final save, exit).
- ``gather_s``: gather_started → gather_finished; ``other_s``: the rest.

The last backup before a failure: Keras' BackupAndRestore saves at every epoch end (its default
``save_freq="epoch"``) and a restarted attempt resumes at the epoch after the last backup; progress
records carry Keras' epoch. So the next attempt's first epoch E says epochs below E were saved, and
the backup was written as the failed attempt left epoch E-1: we take its last progress record of an
epoch below E (the backup is at most one heartbeat later). No such evidence (a custom loop without
epochs, no later attempt, a resume at epoch 0): the attempt's whole training is lost. A final failed
attempt counts only epochs it finished when an earlier resume proved that backups are written. The
"copied the chief's backup" warning says a backup existed, not when it was written: not used. A
``save_freq`` of N steps saves more often than we assume: the lost work is then overstated.

Clocks: events carry the launcher's clock, progress records the nodes' (records go to the attempt
whose start precedes them). Times are clamped into order, so a skew moves time between neighbouring
categories, never out of the wall. Input: typed events (``events.read_events``) and heartbeat records as
``records`` cleans them.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..events import BaseEvent, kinds
from .backup_interval import advice_lines, backup_advice
from .goodputmodel import CATEGORIES, Goodput
from .records import is_number
from .recovery import cause_of, loss_ts, recovery_lines, steps_between, totals
from .split import job_split, weighted

#: What keeps a failed attempt's work (said where goodput books training as lost without a backup).
REMEDY = (
    "a tf.keras.callbacks.BackupAndRestore(backup_dir=os.environ['TFCLUSTER_BACKUP_DIR']) in fit's callbacks "
    "(with restart.max_restarts >= 1) would have kept every finished epoch"
)
#: The share of the slowest worker's excess that must be input for the others' wait to be input's cost
#: (the straggler rule's: ``supervise.stragglers`` names "input pipeline" from half its excess).
INPUT_BOUND = 0.5
BACKUP_NOTE = (
    "work lost to a failure = its training since the last backup: the last epoch end before the epoch the next "
    "attempt resumed at (Keras BackupAndRestore saves at every epoch end); without such evidence, all of it"
)


@dataclass
class Attempt:
    n: int
    start: float | None = None
    end: float | None = None
    state: str | None = None
    failed_at: float | None = None
    points: list[tuple[float, int | None, str]] = field(default_factory=list)  # (ts, epoch, task) of steps made
    steps: list[tuple[float, float, str]] = field(default_factory=list)  # (ts, cumulative steps, task)
    culprit: str | None = None  # the root cause's task

    @property
    def first(self) -> float | None:
        return min((t for t, _, _ in self.points), default=None)

    @property
    def last(self) -> float | None:
        return max((t for t, _, _ in self.points), default=None)

    def first_epoch(self) -> int | None:
        """The epoch the attempt began at: the lowest of each task's first record with an epoch."""
        firsts: dict[str, tuple[float, int]] = {}
        for t, ep, task in self.points:
            if ep is not None and (task not in firsts or t < firsts[task][0]):
                firsts[task] = (t, ep)
        return min((ep for _, ep in firsts.values()), default=None)


def _num(x: Any) -> float | None:
    return float(x) if is_number(x) else None


def _no(n: Any) -> int | None:
    """An attempt number, or None for anything else (a bool, a string, a negative or huge number)."""
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 10_000 else None


def _attempts(events: list[BaseEvent], result: Mapping[str, Any]) -> list[Attempt]:
    """Attempts with their start, end, state and failure time, from events, then result.json."""
    by_n: dict[int, Attempt] = {}
    stops: list[float] = []  # teardowns and interrupts: the failure time when no root cause says it
    for ev in events:
        if isinstance(ev, kinds.Teardown | kinds.Interrupted | kinds.Requeued):
            stops.append(ev.ts)
        elif isinstance(ev, kinds.AttemptStarted) and (n := _no(ev.attempt)) is not None:
            by_n.setdefault(n, Attempt(n)).start = ev.ts
        elif isinstance(ev, kinds.AttemptFinished) and (n := _no(ev.attempt)) is not None:
            a = by_n.setdefault(n, Attempt(n))
            a.end, a.state = ev.ts, ev.state
            a.failed_at = _num(ev.root_cause.get("ts") if ev.root_cause is not None else None)
            culprit = ev.root_cause.get("task") if ev.root_cause is not None else None
            a.culprit = culprit if isinstance(culprit, str) else None
    for d in result.get("attempts") if isinstance(result.get("attempts"), list) else []:
        n = _no(d.get("attempt")) if isinstance(d, dict) else None
        if n is None:
            continue
        a = by_n.setdefault(n, Attempt(n))
        a.start = a.start if a.start is not None else _num(d.get("started_ts"))
        a.end = a.end if a.end is not None else _num(d.get("ended_ts"))
        a.state = a.state or (d.get("state") if isinstance(d.get("state"), str) else None)
        rc = d.get("root_cause")
        a.failed_at = a.failed_at if a.failed_at is not None else _num(rc.get("ts") if isinstance(rc, dict) else None)
    out = sorted((a for a in by_n.values() if a.start is not None), key=lambda a: (a.start, a.n))
    for a in out:
        if a.failed_at is None and a.state != "succeeded":
            a.failed_at = min((t for t in stops if a.start <= t <= (a.end if a.end is not None else t)), default=a.end)
    return out


def _assign(attempts: list[Attempt], beats: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """Training evidence into the attempt it falls in (by time); returns each attempt's profiles."""
    profiles: dict[int, list[Mapping[str, Any]]] = {}
    if not attempts:
        return profiles
    starts = [a.start or 0.0 for a in attempts]  # in order (``_attempts`` sorts by start)

    def which(ts: float) -> int | None:
        """The last attempt started at or before ``ts`` (a search, not a scan: once per record)."""
        i = bisect.bisect_right(starts, ts) - 1
        return i if i >= 0 else None

    progress: dict[tuple[int, Any], list[tuple[float, float, float | None]]] = {}  # (attempt, task) -> records
    for rec in beats:
        task = rec.get("task")
        if rec.get("kind") == "profile":
            ts = _num(rec.get("ts"))
            if ts is not None and (rec.get("steps") or 0) > 0 and (i := which(ts)) is not None:
                attempts[i].points.append((ts, None, task))
                profiles.setdefault(i, []).append(rec)
            continue
        prog = rec.get("progress")
        if not isinstance(prog, dict) or prog.get("phase", "train") != "train" or not (prog.get("steps") or 0) > 0:
            continue
        ts = _num(prog.get("ts")) or _num(rec.get("ts"))
        if ts is not None and (i := which(ts)) is not None:
            ep = prog.get("epoch")
            attempts[i].points.append((ts, int(ep) if is_number(ep) else None, task))
            attempts[i].steps.append((ts, float(prog["steps"]), task))
            progress.setdefault((i, task), []).append((ts, float(prog["steps"]), _num(prog.get("step_time_s"))))
    for (i, task), recs in progress.items():
        if (began := _first_step(sorted(recs), attempts[i].start)) is not None:
            attempts[i].points.append((began, None, task))
    return profiles


def _first_step(recs: list[tuple[float, float, float | None]], start: float | None) -> float | None:
    """When a task's first step began, from its records ``(ts, cumulative steps, step time)`` in one
    attempt: the first record already counts steps made before it (records are rate-limited and can
    come once per epoch), so go back that many steady step times (the median of its records', else
    the rate up to the next record: the first window also holds tracing, which is startup), never
    before the attempt started. None when no step time is known."""
    ts, steps, _ = recs[0]
    times = [t for _, _, t in recs if t is not None and t > 0]
    step_s = statistics.median(times) if times else None
    if step_s is None and len(recs) > 1 and recs[1][0] > ts and recs[1][1] > steps:
        step_s = (recs[1][0] - ts) / (recs[1][1] - steps)
    if step_s is None or not 0 < step_s * steps < 86_400:
        return None
    began = ts - steps * step_s
    return began if start is None else max(start, began)


def _shares(profiles: list[Mapping[str, Any]]) -> tuple[float, float, float, str | None] | None:
    """(input, waiting for the slowest, of that wait the part that waits for its input pipeline, that
    worker) as fractions of a step, from the step-clock windows. When the worker the others wait for is
    late because of its input pipeline (at least half its excess over the others' own work is input, as
    ``stragglers`` judges it), that share of their wait for it is input's cost, not the slowest worker's."""
    per_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in profiles:
        per_task.setdefault(str(r.get("task")), []).append(r)
    workers = {t: w for t, rs in per_task.items() if (w := weighted(rs))}
    split = job_split(workers) if workers else None
    if not split or not split.step_ms or split.step_ms <= 0:
        return None
    inp = min(1.0, max(0.0, (split.input_ms or 0.0) / split.step_ms))
    wait = min(1.0 - inp, max(0.0, split.waiting_for_slowest_ms / split.step_ms))
    slow = split.slowest_worker
    others = [w for t, w in workers.items() if t != slow]
    if wait <= 0 or not others:
        return inp, wait, 0.0, None
    excess = _excess(workers[slow], others, "pre_collective_ms")
    frac = min(1.0, max(0.0, _excess(workers[slow], others, "input_ms") / excess)) if excess > 0 else 0.0
    if frac < INPUT_BOUND:  # late for another reason: the others wait for the slowest worker
        return inp, wait, 0.0, None
    return inp, wait, wait * frac, slow


def _excess(mine: Mapping[str, Any], others: list[Mapping[str, Any]], key: str) -> float:
    return float(mine.get(key) or 0.0) - statistics.median(float(w.get(key) or 0.0) for w in others)


def _backup(a: Attempt, first: float, later: list[Attempt], proven: bool) -> tuple[float, str]:
    """When the failed attempt's last backup was written (its training after it is lost), and why."""
    resumed = next((x.first_epoch() for x in later if x.points and x.first_epoch() is not None), None)
    if resumed is not None:
        why = f"the next attempt resumed at epoch {resumed}"
    elif proven and (top := max((ep for _, ep, _ in a.points if ep is not None), default=None)) is not None:
        resumed, why = top, f"it was in epoch {top} (earlier epochs were backed up)"
    else:
        return first, f"no backup evidence: all its training is lost; {REMEDY}"
    before = [t for t, ep, _ in a.points if ep is not None and ep < resumed]
    return (max(before), why) if before else (first, why + ": nothing it trained was kept")


def goodput(
    events: list[BaseEvent], beats: list[dict[str, Any]], result: Mapping[str, Any] | None, finished: bool = True
) -> dict[str, Any] | None:
    """The wall time split into CATEGORIES (seconds), ``goodput`` (a fraction) and per-attempt detail;
    None when the run has no start to measure from."""
    result = result if isinstance(result, Mapping) else {}
    begun = [e.ts for e in events if isinstance(e, kinds.JobStarted)]
    start = min(begun) if begun else _num(result.get("started_ts"))
    if start is None:
        start = min((e.ts for e in events), default=None)
    stamps = [e.ts for e in events] + [x for x in [_num(result.get("ended_ts"))] if x is not None]
    if not finished:
        stamps += [t for r in beats if (t := _num(r.get("ts"))) is not None]
    end = max(stamps, default=None)
    if start is None or end is None or end <= start:
        return None
    attempts = [a for a in _attempts(events, result) if a.start is not None and a.start < end]
    profiles = _assign(attempts, beats)
    run_shares = _shares([r for rs in profiles.values() for r in rs])
    trained = any(a.points for a in attempts)
    proven = any((ep := a.first_epoch()) is not None and ep > 0 for a in attempts[1:])
    sums = dict.fromkeys(CATEGORIES, 0.0)
    t = start

    def upto(cat: str, until: float | None) -> float:
        nonlocal t
        u = t if until is None else min(max(until, t), end)
        sums[cat] += u - t
        was, t = t, u
        return u - was

    details = []
    waits_for: dict[str, float] = {}  # per worker: the others' wait for its input pipeline (in input_stall_s)
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        gap = upto("startup_s" if i == 0 else "failure_s", a.start)
        connect = gap if i == 0 else 0.0  # attempt 0's startup holds connecting and the preflight
        d: dict[str, Any] = {"attempt": a.n, "state": a.state}
        body = "startup_s" if trained else "other_s"
        ok = a.state == "succeeded" or (nxt is None and not finished and a.end is None)
        if not a.points:
            d["startup_s"] = connect + upto(body, a.end if ok or a.failed_at is None else a.failed_at)
        else:
            d["startup_s"] = connect + upto("startup_s", a.first)
            keep, why = (a.last, None) if ok else _backup(a, a.first or t, attempts[i + 1 :], proven)
            # one attempt with windows: its shares are the run's (the same windows, in the same order)
            mine = run_shares if list(profiles) == [i] else _shares(profiles.get(i, []))
            shares = mine or run_shares or (0.0, 0.0, 0.0, None)
            span = upto("productive_s", keep)
            sums["productive_s"] -= span * (shares[0] + shares[1])
            sums["input_stall_s"] += span * (shares[0] + shares[2])  # a worker's input the others wait for: input
            sums["straggler_wait_s"] += span * (shares[1] - shares[2])
            if shares[3] is not None:
                waits_for[shares[3]] = waits_for.get(shares[3], 0.0) + span * shares[2]
            d["training_s"] = span
            if not ok:
                d["lost_work_s"], d["backup"] = upto("redone_s", a.failed_at), why
                d["work_redone_steps"] = steps_between(a.steps, keep if keep != a.first else None, t)
        if nxt is not None:
            cause = cause_of(events, nxt.n) if a.state == "failed" else None  # a requeue is no failure
            d["until_next_attempt_s"] = upto("host_lost_s" if cause == "host_lost" else "failure_s", nxt.start)
            if cause is not None and a.failed_at is not None:
                lost = loss_ts(events, a.culprit, a.failed_at, a.start or start)
                d["cause"], d["loss_ts"] = cause, lost
                d["loss_to_training_s"] = nxt.first - lost if nxt.first is not None else None
        else:
            d["teardown_s"] = upto("teardown_s", a.end)
        details.append({k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()})
    g0 = min((e.ts for e in events if isinstance(e, kinds.GatherStarted)), default=None)
    if g0 is not None:
        upto("other_s", g0)
        upto(
            "gather_s",
            max((e.ts for e in events if isinstance(e, kinds.GatherFinished | kinds.GatherFailed)), default=end),
        )
    upto("other_s", end)
    wall = end - start
    out: dict[str, Any] = {"wall_s": round(wall, 3), **{k: round(v, 3) for k, v in sums.items()}}
    out["goodput"] = round(sums["productive_s"] / wall, 4) if trained else None
    out["finished"] = finished
    out["step_clock"] = run_shares is not None
    out["attempts"] = details
    out["input_waits"] = {t: round(v, 3) for t, v in waits_for.items() if v > 0}
    out["recovery"] = totals(details)  # the cost of failures: loss to training again, work redone
    out["backup_interval"] = backup_advice(events, wall)  # Young-Daly, from the run's copies and failures
    notes = []
    if not trained:
        notes.append("no training steps were reported (progress records): productive time is unknown")
    elif run_shares is None:
        notes.append("no step-clock windows: input stalls and straggler waits are unknown (counted as productive)")
    if any(a.state != "succeeded" for a in attempts) and trained:
        notes.append(BACKUP_NOTE)
    if not finished:
        notes.append("the run has not finished: up to its latest record")
    out["notes"] = notes
    return out


def goodput_report(
    events: list[BaseEvent], beats: list[dict[str, Any]], result: Mapping[str, Any] | None, finished: bool = True
) -> Goodput | None:
    """``goodput`` as the report holds it (typed); None when the run has no start to measure from."""
    g = goodput(events, beats, result, finished)
    return None if g is None else Goodput.of(g)


def goodput_lines(g: Goodput) -> list[str]:
    """The report's goodput section: one line per category, seconds and share of the wall."""
    wall = g.wall_s or 0.0
    gp = g.goodput
    head = (
        f"goodput {gp:.1%} of {wall:.1f} s wall time" if gp is not None else f"goodput unknown ({wall:.1f} s wall time)"
    )
    lines = [head + ("" if g.finished else " so far") + ":"]
    for k, label in CATEGORIES.items():
        v = g.seconds.get(k) or 0.0
        lines.append(f"  {label:<52}{v:9.1f} s  {v / wall if wall > 0 else 0.0:6.1%}")
        if k == "input_stall_s":
            for task, w in g.input_waits.items():
                text = f"  of which the others waiting for {task}'s input"
                lines.append(f"  {text:<52}{w:9.1f} s  {w / wall if wall > 0 else 0.0:6.1%}")
    for a in g.attempts:
        if a.backup:
            lines.append(f"  attempt {a.attempt}: lost {a.lost_work_s or 0:.1f} s of training ({a.backup})")
    lines += recovery_lines(g)
    lines += [f"  ({n})" for n in g.notes]
    return lines + [f"  {x}" for x in advice_lines(g.backup_interval)]
