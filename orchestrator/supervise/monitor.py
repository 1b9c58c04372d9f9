"""Pure supervision policy: from heartbeats, progress and profiles to verdicts. No I/O, no clock.

The supervisor feeds it observations stamped with a monotonic `now` and asks `check(now)`; tests do
the same with made-up times.

Why these rules:
- lost: a worker (or its host, or the link) silent for `timeout_s` will never finish a collective;
- hung: a stopped process (SIGSTOP, state T) holds every peer inside the next all-reduce. We do not
  wait for TensorFlow's own ~10 s heartbeat: 2 intervals of evidence is enough and names the culprit
  before its peers fail and look guilty;
- stalled: no step anywhere for `progress_timeout_s` after training began = a wedged collective;
- startup: MWMS waits forever in the strategy constructor for a task that never starts;
- straggler: under synchronous all-reduce all wall step times are equal (the fast wait inside the
  collective), so we compare the time each worker spends outside the all-reduces, and what each
  worker's host says about itself (evidence: a starved CPU, a GPU problem, a bad link);
- gpu_problem: a GPU fault, a GPU shared with another program, a power limit below the board's, or a
  GPU slower than its same-model peers (``gpus``: the one judgement status, report and metrics use);
- slowing: a worker whose own speed fell well below its best window (scores), even when all workers
  were equally slow at first.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from worker_entry import protocol as p

from .evidence import Scores, explain
from .figures import job_step_ms
from .gpuwatch import GpuWatch
from .liveness import STOPPED_STATES, Floors, Watch, lost, progress_verdicts
from .liveness import hung as hung_verdict
from .remedies import with_remedy
from .startup import BUSY_PCT, startup_verdict
from .stragglers import StragglerFinding, find_straggler
from .verdicts import Policy, Verdict


class Monitor:
    def __init__(self, tasks: list[str], policy: Policy, now: float, members: set[str] | None = None) -> None:
        """``members``: the tasks judged as members of the training (startup, progress, stragglers, GPUs;
        ``plan.roles``); every task is watched for silence and SIGSTOP. Default: all."""
        self.policy = policy
        self.members = set(tasks) if members is None else set(members)
        self.watch = {t: Watch(last_seen=now) for t in tasks}
        self.armed_at: float | None = None
        self._round = 0
        self._straggler: str | None = None
        self._candidate: tuple[str | None, int] = (None, 0)
        self._clear_count = 0
        self.last_finding: StragglerFinding | None = None
        self.scores: dict[str, dict[str, float]] = {}
        self._scores = Scores()
        self.gpus = GpuWatch()  # each task's recent GPU samples and models, and the judgement of them
        self._live = set(self.members)  # members not done
        self._live_sorted: list[str] | None = None  # sorted(_live), kept until it changes (the GPU judgement's)
        self._unprofiled = set(self.members)  # live, without a profile this round
        self._floors = Floors(now)  # bounds that let a tick skip scanning every task (``liveness``)
        self._stopped: set[str] = set()  # tasks whose process is stopped, not yet judged hung
        self._unstarted = set(self.members)  # members that neither said started nor stepped
        self._index = {t: i for i, t in enumerate(tasks)}  # the watch order, in which verdicts come

    # --- observations ------------------------------------------------------------------------

    def arm(self, now: float) -> None:
        """The go was sent: the startup deadline and heartbeat timeouts start now."""
        self.armed_at = now
        for w in self.watch.values():
            w.last_seen = max(w.last_seen, now)

    def seen(self, task: str, now: float) -> None:
        self.watch[task].last_seen = now
        if now < self._floors.seen:
            self._floors.seen = now

    def on_heartbeat(self, task: str, hb: p.Heartbeat, now: float, record: dict[str, Any] | None = None) -> None:
        """``record``: the heartbeat as written to heartbeats.jsonl, when there is one (its samples are
        taken from it, not converted a second time)."""
        w = self.watch[task]
        rec = record or {}
        w.last_seen = now
        if now < self._floors.seen:
            self._floors.seen = now
        state = hb.state
        if state is not None:
            w.proc_state = state
            if state in STOPPED_STATES:
                if w.stopped_since is None:
                    w.stopped_since = now
                    self._stopped.add(task)
            elif w.stopped_since is not None:
                w.stopped_since = None
                self._stopped.discard(task)
        if hb.cpu_pct is not None and hb.cpu_pct >= BUSY_PCT:
            w.busy_at = now
        if hb.progress is not None:
            self.on_steps(task, hb.progress.steps, now)
        if hb.host is not None:
            w.hosts.append(rec.get("host") or hb.host.to_dict())
        if hb.gpus is not None:
            self.gpus.on_sample(task, rec.get("gpus") or [g.to_dict() for g in hb.gpus])

    def on_steps(self, task: str, steps: int, now: float) -> None:
        w = self.watch[task]
        if not w.started:
            w.started = True
            self._unstarted.discard(task)
        if w.steps is None or steps != w.steps:
            w.steps = steps
            w.steps_changed_at = now
            floors = self._floors
            if now < floors.changed:
                floors.changed = now
            if now > floors.newest and not w.done and task in self.members:
                floors.newest = now

    def on_started(self, task: str, now: float) -> None:
        self.watch[task].started = True
        self._unstarted.discard(task)
        self.seen(task, now)

    def on_profile(self, task: str, record: dict[str, Any], now: float) -> list[Verdict]:
        """Store a profile; when every live worker has one for this round, evaluate stragglers."""
        w = self.watch[task]
        self.seen(task, now)
        if task not in self.members:  # not in the collective: no straggler of it
            return []
        w.profile = record
        w.profile_round = self._round
        self._unprofiled.discard(task)  # (a set, not a scan of every task per profile)
        if self._unprofiled or len(self._live) < 2:
            return []
        live = [t for t in self.watch if t in self._live]
        self._unprofiled = set(live)
        profiles = {t: self.watch[t].profile for t in live if self.watch[t].profile}
        self._round += 1
        finding = find_straggler(profiles, self.policy.stragglers)
        finding = explain(
            finding,
            {t: self.watch[t].hosts for t in live},  # (read, not kept: no copy of every task's samples a round)
            self.gpus.judgement,
            profiles,
        )
        slowing = self._judge_scores(profiles)  # first: the straggler event carries the scores
        return self._judge_stragglers(finding) + slowing

    def _judge_scores(self, profiles: dict[str, Any]) -> list[Verdict]:
        """A worker slowing down against its own best window, more than the others did."""
        self.scores = self._scores.update(profiles)
        pol = self.policy.stragglers
        out = []
        step = job_step_ms(profiles.values())
        ranked = sorted(x["individual"] for x in self.scores.values())
        for t, s in self.scores.items():
            w = self.watch[t]
            typical = _median_without(ranked, s["individual"])  # the others' (one sort a round, not one a task)
            excess = s["local_ms"] - (s["best_local_ms"] or s["local_ms"])
            slow = (
                s["individual"] < pol.slowing_score
                and s["individual"] <= typical - pol.slowing_margin
                and excess >= pol.min_ms
                and excess >= pol.min_share * step
            )
            w.slow_rounds = w.slow_rounds + 1 if slow else 0
            if w.slow_rounds >= pol.confirmations and "slowing" not in w.reported:
                w.reported.add("slowing")
                out.append(
                    Verdict(
                        "worker_slowing",
                        t,
                        f"slowing down: its work per step outside the all-reduces is {s['local_ms']:.1f} ms, "
                        f"{1 / s['individual']:.1f}x its best window ({s['best_local_ms']:.1f} ms); "
                        f"relative to the fastest worker {s['relative']:.2f}",
                        fatal=False,
                        data={
                            "individual_score": s["individual"],
                            "relative_score": s["relative"],
                            "local_ms": s["local_ms"],
                            "best_local_ms": s["best_local_ms"],
                        },
                    )
                )
            elif s["individual"] >= 0.8:
                w.reported.discard("slowing")
        return out

    def revive(self, task: str, now: float) -> None:
        """The task was started again in place (a parameter-server worker): watched afresh, with the
        startup deadline (not the heartbeat timeout) to say hello, as at the job's start."""
        self.watch[task] = Watch(last_seen=now + max(0.0, self.policy.startup_timeout_s - self.policy.timeout_s))
        self._stopped.discard(task)
        self._floors.seen = min(self._floors.seen, now)
        self._floors.exact = False
        if task in self.members:
            self._live.add(task)
            self._live_sorted = None
            self._unprofiled.add(task)
            self._unstarted.add(task)

    def on_terminal(self, task: str) -> None:
        self.watch[task].done = True
        self._live.discard(task)
        self._live_sorted = None
        self._unprofiled.discard(task)
        self._stopped.discard(task)
        self._floors.exact = False
        self.gpus.forget(task)

    def _gpu_verdicts(self) -> list[Verdict]:
        """New GPU problems, judged once per round of heartbeats with the step clock's latest scores."""
        if not self.gpus.samples:  # (no task has GPUs: nothing to judge, no sort of every task per tick)
            return []
        if self._live_sorted is None:
            self._live_sorted = sorted(self._live)
        return [
            Verdict(
                "gpu_problem",
                g.task,
                g.text(),
                fatal=False,
                data={"gpu": g.gpu, "problem": g.problem, "model": g.model, "reading": g.reading},
            )
            for g in self.gpus.judge(self._live_sorted, self.scores)
        ]

    # --- decisions ---------------------------------------------------------------------------

    def silent_past_timeout(self, now: float) -> list[str]:
        """Tasks not done and not heard from for ``timeout_s``: during a teardown, waiting longer
        for their exit confirmation only delays the launcher (their node stops them by itself)."""
        if self.armed_at is None:  # before the go, the startup deadline rules
            return []
        return [t for t, w in self.watch.items() if not w.done and now - w.last_seen >= self.policy.timeout_s]

    def _judge_stragglers(self, finding: StragglerFinding | None) -> list[Verdict]:
        p = self.policy.stragglers
        name = finding.task if finding else None
        prev, count = self._candidate
        count = count + 1 if name == prev else 1
        self._candidate = (name, count)
        out: list[Verdict] = []
        if finding is not None:
            self.last_finding = finding
        # host evidence alone (a stall inside the all-reduce, unseen by the step clock) must hold twice as
        # long: on a saturated box one worker or another is starved for a few seconds at a time
        needed = 2 * p.confirmations if finding is not None and finding.host_only else p.confirmations
        if finding is not None and count >= needed and self._straggler != name:
            self._straggler = name
            self._clear_count = 0
            if not finding.host_only:
                msg = (
                    f"straggler: the other workers wait ≈{finding.wait_ms:.0f} ms per step for it "
                    f"({finding.share:.0%} of a {finding.step_ms:.0f} ms step); likely cause: {finding.cause} — "
                    f"{finding.detail}"
                )
            else:  # its stall is inside the all-reduce: its host's evidence names it
                msg = (
                    f"straggler: every worker's {finding.step_ms:.0f} ms step waits for it; likely cause: "
                    f"{finding.cause} — {finding.detail}"
                )
            out.append(
                Verdict(
                    "straggler",
                    name,
                    with_remedy(msg, finding.cause),
                    fatal=p.kill,
                    data={
                        "wait_ms": round(finding.wait_ms, 2),
                        "step_ms": round(finding.step_ms, 2),
                        "share": round(finding.share, 3),
                        "cause": finding.cause,
                        "pre_collective_ms": {k: round(v, 2) for k, v in finding.pre_ms.items()},
                        "relative_score": (self.scores.get(name) or {}).get("relative"),
                    },
                )
            )
        elif self._straggler is not None and name != self._straggler:
            self._clear_count += 1
            if self._clear_count >= p.confirmations:
                out.append(Verdict("straggler_cleared", self._straggler, "no longer a straggler", fatal=False))
                self._straggler = None
                self._clear_count = 0
        elif name == self._straggler:
            self._clear_count = 0
        return out

    @property
    def straggler(self) -> str | None:
        return self._straggler

    def check(self, now: float) -> list[Verdict]:
        """The verdicts due at ``now``. Every task is scanned only when ``Floors`` says one may be due
        (or a process is stopped): at 4,096 tasks and 10 Hz that scan was the monitor's largest cost."""
        p = self.policy
        floors = self._floors
        out: list[Verdict] = []
        scanned = False
        if now - floors.seen > p.timeout_s or self._stopped:
            scanned = True
            for t, w in self.watch.items():
                if w.done:
                    continue
                silent = now - w.last_seen
                if silent > p.timeout_s and "lost" not in w.reported:
                    w.reported.add("lost")
                    out.append(lost(t, silent, p.timeout_s))
                if (
                    w.stopped_since is not None
                    and now - w.stopped_since >= p.stopped_after_s
                    and "hung" not in w.reported
                ):
                    w.reported.add("hung")
                    self._stopped.discard(t)
                    out.append(hung_verdict(t, w, now))
        if self.armed_at is not None and now - self.armed_at > p.startup_timeout_s and self._unstarted:
            late = [
                t
                for t in sorted(self._unstarted, key=self._index.__getitem__)
                if not (w := self.watch[t]).done and not w.started and "startup" not in w.reported
            ]
            if late:
                for t in late:
                    self.watch[t].reported.add("startup")
                self._unstarted.difference_update(late)
                # an idle late task is named before a busy one (slow on a loaded box, not stuck)
                out.append(startup_verdict(late, {t: self.watch[t].busy_at for t in late}, now, p))
        limit = p.progress_timeout_s
        if limit is not None and not (
            floors.exact
            and (floors.newest == -math.inf or (now - floors.newest <= limit and now - floors.changed <= limit))
        ):
            scanned = True
            members = self.members
            live = {t: w for t, w in self.watch.items() if not w.done and t in members}
            out.extend(progress_verdicts(now, live, limit))
        if scanned:
            floors.rescan(self.watch, self.members)
        out.extend(self._gpu_verdicts())
        return out

    def suspects(self, now: float, exclude: str | None = None) -> list[Verdict]:
        """Tasks already silent or stopped: when a peer fails now, they are the likely cause. Not before
        the go: nothing trains yet, so no silence can have caused a peer's failure, and a task still
        starting (a slow interpreter on a busy host) would be named for a peer's own fault."""
        if self.armed_at is None:
            return []
        out = []
        for t, w in self.watch.items():
            if w.done or t == exclude:
                continue
            if w.stopped_since is not None:
                out.append(
                    Verdict(
                        "hung",
                        t,
                        f"training process was stopped (state {w.proc_state}) for {now - w.stopped_since:.1f}s "
                        "before its peers failed",
                        fatal=True,
                        data={"state": w.proc_state, "suspect": True},
                    )
                )
            elif now - w.last_seen > self.policy.suspect_after_s:
                out.append(
                    Verdict(
                        "lost",
                        t,
                        f"silent for {now - w.last_seen:.1f}s before its peers failed: its process, host or "
                        "network was gone first",
                        fatal=True,
                        data={"silent_s": round(now - w.last_seen, 2), "suspect": True},
                    )
                )
        return out


def _median_without(ranked: list[float], value: float) -> float:
    """The median of sorted ``ranked`` less one occurrence of ``value`` (1.0 when nothing is left)."""
    n = len(ranked) - 1
    if n <= 0:
        return 1.0
    i = bisect.bisect_left(ranked, value)

    def at(k: int) -> float:
        return ranked[k] if k < i else ranked[k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
