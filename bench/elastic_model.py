"""A thousand-task job that loses hosts for good, simulated: what each policy costs (issue 34, item 9).
Pure (no processes, no clock): ``bench/elastic_sim.py`` runs it and prints the tables; the unit tests
(tests/test_elastic_sim.py) check its parts.

Time is simulated seconds; nothing sleeps. What decides is the launcher's real attempt policy: after
every failed attempt ``orchestrator.job.policy.RestartPolicy.decide`` gets the attempt as the
supervisor records it (an ``AttemptResult`` whose root cause is the lost host's ``lost`` failure, or a
``connect`` failure when an attempt starts on a host that is gone) and the job's ``Members`` (hosts,
spares, ``restart.min_workers``), and its decision (restart in place, reshape with a spare or one worker
fewer, finish) is what the simulation does next. The rest is a model, each figure a parameter:

- **host losses**: a Poisson process, one every ``loss_every_s`` on average at the planned size (the
  job's MTBF), each hitting a host that runs a task (a job of n < N workers is hit n/N as often: the
  rate is per host). A lost host never comes back.
- **an attempt**: ``startup_s`` (TensorFlow, connecting, restoring the backup: the first step comes
  after it), then training. Every ``backup_every_s`` of training the chief saves for ``save_s``
  (training waits: the save cost C). With n of N workers the global batch is kept (issue 34's rule),
  so a step takes N/n as long: work progresses at n/N.
- **a loss**: training stops (the collective waits for the silent host) until the heartbeat timeout
  (``detect_s``) says so; the work since the last backup is lost; the teardown, the decision, the new
  plan and reconnecting take ``recover_s``; then the next attempt's ``startup_s``. A host lost during
  a startup fails that attempt too.
- **a restart in place** on a plan that still holds a lost host: its connect fails after ``recover_s``.
  As the job's connect step does (``job.reshaping.connect_elastic``): an elastic job reshapes without
  that host (``reshape_decision``), any other run ends ``start_failed`` (what the launcher did before
  issue 34).

Measured per run: goodput (work done, in seconds of the full job's training, over the wall time: saves,
startups, detection, recovery, redone work and a shrunk job's slower steps are all badput), each
failure's loss to training again (the loss → the next attempt's first step, as ``report`` defines it),
the work redone (training seconds since the last backup), the workers at the end and how the run ended.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.core.result import AttemptResult, Failure
from orchestrator.core.states import JobState
from orchestrator.job.policy import Action, Decision, Exclusion, Members, RestartPolicy, reshape_decision
from orchestrator.supervise import Interrupt


@dataclass(frozen=True)
class SimConfig:
    """One simulated job (seconds are simulated seconds)."""

    tasks: int = 1024
    spares: int = 8
    min_workers: int | None = None  # None: the planned count (no shrinking, the spec's default)
    loss_every_s: float = 120.0  # the job's MTBF at its planned size
    backup_every_s: float = 600.0  # training between two saves
    save_s: float = 10.0  # C: training waits while the chief saves
    detect_s: float = 10.0  # the heartbeat timeout
    recover_s: float = 8.0  # teardown, decision, new plan, reconnect (the launcher's part)
    startup_s: float = 30.0  # TensorFlow's start and the restore, to the first step
    horizon_s: float = 4 * 3600.0  # the simulated wall time
    max_restarts: int = 1000

    def members(self) -> Members:
        hosts = tuple(f"node{i}" for i in range(self.tasks))
        return Members(
            hosts=hosts,
            tasks=_dense(len(hosts)),
            spares=tuple(f"spare{i}" for i in range(self.spares)),
            planned=self.tasks,
            min_workers=self.tasks if self.min_workers is None else self.min_workers,
            reshapes=True,
        )


@dataclass
class SimResult:
    goodput: float
    work_s: float  # work done, in seconds of the planned job's training
    wall_s: float
    state: str  # running (the horizon came first) or failed (the policy ended it)
    ended_why: str | None
    workers: int  # at the end
    losses: int  # hosts lost
    reshapes: int
    restarts: int  # in place (the non-elastic path)
    loss_to_training_s: list[float] = field(default_factory=list)  # per failure that trained again
    redone_s: list[float] = field(default_factory=list)  # per failure: training since the last backup
    saves: int = 0
    ended_at: float | None = None  # when the policy ended the run (None: it ran to the horizon)

    def to_dict(self) -> dict[str, Any]:
        again = self.loss_to_training_s
        return {
            "goodput": round(self.goodput, 4),
            "work_s": round(self.work_s, 1),
            "wall_s": round(self.wall_s, 1),
            "state": self.state,
            "ended_why": self.ended_why,
            "workers": self.workers,
            "losses": self.losses,
            "reshapes": self.reshapes,
            "restarts": self.restarts,
            "saves": self.saves,
            "loss_to_training_mean_s": round(statistics.fmean(again), 1) if again else None,
            "loss_to_training_max_s": round(max(again), 1) if again else None,
            "redone_total_s": round(sum(self.redone_s), 1),
            "redone_mean_s": round(statistics.fmean(self.redone_s), 1) if self.redone_s else None,
        }


def _dense(n: int) -> tuple[str, ...]:
    return tuple(f"worker:{i}" for i in range(n))


def next_loss(rng: random.Random, t: float, cfg: SimConfig, workers: int) -> float:
    """The next host loss after ``t``: exponential at ``workers`` / N of the planned job's rate."""
    rate = workers / (cfg.tasks * cfg.loss_every_s)
    return t + rng.expovariate(rate) if rate > 0 else math.inf


def train(start: float, until: float, cfg: SimConfig, since_save: float) -> tuple[float, float, float, int]:
    """Training from ``start`` (``since_save`` s of training since the last save) until ``until``:
    (training seconds, of them after the last completed save, the time the last save completed (or
    -inf), saves completed). A save interrupted by ``until`` does not count."""
    t, trained, after, saves, saved_at = start, 0.0, since_save, 0, -math.inf
    while True:
        to_save = cfg.backup_every_s - after
        if t + to_save >= until:
            trained += until - t
            after += until - t
            return trained, after, saved_at, saves
        t += to_save
        trained += to_save
        if t + cfg.save_s > until:  # the save never completes
            return trained, cfg.backup_every_s, saved_at, saves
        t += cfg.save_s
        saves += 1
        saved_at, after = t, 0.0


def failed_attempt(n: int, started: float, ts: float, kind: str, host: str, task: str | None) -> AttemptResult:
    """An attempt as the supervisor records it when ``host`` failed at ``ts`` (its root cause)."""
    message = "no heartbeat: host gone" if kind == "lost" else "cannot reach the host"
    return AttemptResult(n, JobState.FAILED, started, ts, {}, [Failure(kind, message, ts, task, host, attempt=n)])


def simulate(cfg: SimConfig, seed: int = 0) -> SimResult:
    """One run to the horizon (or until the policy ends it)."""
    rng = random.Random(seed)
    policy = RestartPolicy(cfg.max_restarts)
    members = cfg.members()
    gone: set[str] = set()
    earlier: list[AttemptResult] = []
    work = 0.0  # kept work, in seconds of the planned job's training
    t, n = 0.0, 0
    res = SimResult(0.0, 0.0, cfg.horizon_s, "running", None, len(members.hosts), 0, 0, 0)
    pending: float | None = None  # the loss not yet trained again after
    while t < cfg.horizon_s:
        workers = len(members.hosts)
        speed = workers / cfg.tasks
        stale = next((h for h in members.hosts if h in gone), None)
        decision: Decision | None = None
        if stale is not None:  # a plan with a host that is gone: its connect fails (connect_elastic)
            t += cfg.recover_s
            if not members.elastic:
                res.state, res.ended_at, res.ended_why = "failed", t, f"start_failed: cannot reach {stale}"
                break
            decision = reshape_decision(members, Exclusion(stale, "connect: unreachable", n, t))
        else:
            loss = next_loss(rng, t, cfg, workers)
            first_step = t + cfg.startup_s
            if loss >= cfg.horizon_s and first_step < cfg.horizon_s:
                trained, _, _, saves = train(first_step, cfg.horizon_s, cfg, 0.0)
                work += trained * speed
                res.saves += saves
                if pending is not None:
                    res.loss_to_training_s.append(first_step - pending)
                break
            if loss >= cfg.horizon_s:
                break
            at = rng.randrange(workers)
            host, task = members.hosts[at], members.tasks[at] if members.tasks else None
            gone.add(host)
            res.losses += 1
            if loss > first_step:
                trained, redone, _, saves = train(first_step, loss, cfg, 0.0)
                work += (trained - redone) * speed
                res.saves += saves
                res.redone_s.append(redone)
                if pending is not None:
                    res.loss_to_training_s.append(first_step - pending)
                pending = loss
            elif pending is None:
                pending = loss
            attempt = failed_attempt(n, t, loss, "lost", host, task)
            t = loss + cfg.detect_s
            decision = policy.decide(attempt, earlier, Interrupt(), members)
            earlier.append(attempt)
            n += 1
        if decision.action is Action.RESHAPE and decision.reshape is not None:
            members = replace(decision.reshape.after, tasks=_dense(len(decision.reshape.after.hosts)))
            res.reshapes += 1
            t += cfg.recover_s
        elif decision.action is Action.RESTART:
            res.restarts += 1
        else:
            res.state, res.ended_at = "failed", t
            res.ended_why = decision.run_failure.message if decision.run_failure else "restart budget spent"
            break
    res.work_s = work
    res.goodput = work / cfg.horizon_s
    res.workers = len(members.hosts)
    return res


def young_daly_s(save_s: float, mtbf_s: float) -> float:
    """The advice ``report`` and ``predict`` give: √(2 · C · M) (``views.backup_interval.young_daly``)."""
    from orchestrator.views.backup_interval import young_daly

    return young_daly(save_s, mtbf_s)


def mean_goodput(cfg: SimConfig, seeds: int) -> float:
    return statistics.fmean(simulate(cfg, s).goodput for s in range(seeds))


def sweep(cfg: SimConfig, factors: tuple[float, ...], seeds: int) -> list[dict[str, Any]]:
    """Goodput against the backup interval, at ``factors`` x the Young-Daly advice for ``cfg``."""
    advice = young_daly_s(cfg.save_s, cfg.loss_every_s)
    rows = []
    for f in factors:
        interval = advice * f
        rows.append(
            {
                "factor": f,
                "interval_s": round(interval, 1),
                "goodput": round(mean_goodput(replace(cfg, backup_every_s=interval), seeds), 4),
            }
        )
    return rows
