"""`tfcluster report`: why a job does (not) scale, from its heartbeats and step-clock windows.

Under synchronous all-reduce a step lasts as long as the slowest worker's own work plus the
all-reduce; the others wait inside it. Each step-clock window splits a worker's step into parts that
add up to it (input, compute, collective, update, host — see ``split``); from the workers' splits we
separate waiting for the slowest worker from the all-reduce itself, name the slowest worker and the
part where its excess lies, and ask each worker's host (CPU run-queue delay, cgroup throttling,
steal, TCP retransmissions) and GPUs (``supervise.gpus``: the judgement the live monitor uses) before
calling anything "communication-bound" — and whether every host shares a problem (``supervise.shared``)
that inflates the all-reduce itself. With mixed GPU models, ``pace`` says which sets the pace.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..events import BaseEvent
from ..events.kinds import RoleFailure, ScriptHint, Straggler, TaskReady, TrainingEnded, WorkerSlowing
from ..plan.policy import StragglerPolicy
from ..plan.record import PlanRecord
from ..runs import RunDir, plan_or_none
from ..supervise import GpuJudgement, explain, find_straggler, host_suspect, judge_gpus
from ..supervise.figures import Figures, TaskFigures, throughput
from ..supervise.gpus import WORK_RATIO
from ..supervise.remedies import with_remedy
from ..supervise.shared import SharedProblem, inflation_advice, shared_problems
from .evaluations import evaluation_report
from .goodput import goodput_report
from .goodputmodel import Goodput
from .loss import curve_report
from .noise_scale import noise_report
from .pace import Pace, pace, pace_advice
from .records import event_records, heartbeat_records, json_object
from .reportmodel import (
    HOST_KEYS,
    Analysis,
    GpuModels,
    Report,
    RoleNote,
    Roles,
    SlowingNote,
    StragglerNote,
    Window,
    WorkerRow,
    flat_workers,
)
from .reporttext import report_text
from .reshapes import reshape_report
from .split import job_split, scores

__all__ = ["Report", "analyse", "build_report", "report_text"]


def median_or_none(xs: list[float | None]) -> float | None:
    """The median of the values that are there (None when none is)."""
    xs = [float(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def build_report(run: RunDir, last_s: float | None = None, records: list[dict[str, Any]] | None = None) -> Report:
    """The report of a run, built once (``reportmodel.Report``); ``last_s`` keeps only samples from the
    run's last ``last_s`` seconds (a straggler that appeared mid-run is diluted in whole-run means).
    ``records``: the run's heartbeat records when the caller has read them already (a long run's file
    is large)."""
    if records is None:  # damaged records skipped: a report, never a traceback
        records = heartbeat_records(run.heartbeats_jsonl)
    records = [r for r in records if r.get("task")]
    every_profile, every_beat = _split_by_task(records)  # scores: last windows vs the run's best
    # the end of training: the last step-clock sample (heartbeats go on through teardown)
    end = max((r.get("ts") or 0 for rs in every_profile.values() for r in rs), default=0) or max(
        (r.get("ts") or 0 for r in records), default=0
    )
    window, selected = None, records
    if last_s is not None:
        start = end - last_s
        selected = [
            r
            for r in records
            if start <= (r.get("ts") or 0) and (r.get("kind") == "profile" or (r.get("ts") or 0) <= end)
        ]
        window = Window(last_s, round(start, 3), round(end, 3))
    profiles, beats = (every_profile, every_beat) if last_s is None else _split_by_task(selected)
    plan = plan_or_none(run)  # a damaged plan.json: the figures all the same, without hosts
    policy = plan.policy if plan else StragglerPolicy()  # the thresholds the live monitor judged this run with
    hosts = plan.hosts() if plan else {}
    figures = Figures()  # the tasks' figures, fed the records the supervisor fed them live, in order
    for rec in selected:
        figures.add(rec["task"], rec)
    whole = figures.final()
    events = event_records(run.events_jsonl)
    stragglers = tuple(StragglerNote.of(ev) for ev in events if isinstance(ev, Straggler))
    slowing = tuple(SlowingNote.of(ev) for ev in events if isinstance(ev, WorkerSlowing))
    gpu_models = {ev.task: ev.gpus for ev in events if isinstance(ev, TaskReady) and ev.task}
    sc = scores(every_profile)

    workers: dict[str, WorkerRow] = {}
    host_samples: dict[str, list[dict[str, Any]]] = {}
    training_hosts: dict[str, list[dict[str, Any]]] = {}
    gpu_beats: dict[str, list[list[dict[str, Any]]]] = {}
    for task in sorted(set(hosts) | set(beats) | set(profiles)):
        bs = beats.get(task, [])
        host_samples[task] = [b["host"] for b in bs if isinstance(b.get("host"), dict)]
        trained = _training(bs, end)  # GPUs and shared host problems: judged while it trained
        training_hosts[task] = [b["host"] for b in trained if isinstance(b.get("host"), dict)]
        gpu_beats[task] = [b["gpus"] for b in trained if isinstance(b.get("gpus"), list) and b["gpus"]]
        workers[task] = WorkerRow(
            task=task,
            host=hosts.get(task),
            figures=whole.get(task, TaskFigures()),  # steps, step time, rates, CPU: what `status` shows
            rss_mb_max=max((b.get("rss_mb") or 0 for b in bs), default=None),
            gpu_util_pct=_round(median_or_none([g.get("util") for b in bs for g in (b.get("gpus") or [])])),
            gpus=tuple(gpu_models.get(task, [])),
            profiles=len(profiles.get(task, [])),
            cpu_ms=_round(median_or_none([p.get("cpu_ms") for p in profiles.get(task, [])])),
            evidence={k: _round(median_or_none([h.get(k) for h in host_samples[task]])) for k in HOST_KEYS},
            relative_score=sc.get(task, {}).get("relative"),
            individual_score=sc.get(task, {}).get("individual"),
        )
    flat = flat_workers(workers)  # what the pure policies read (the live monitor's shape)
    work = {
        t: {"local_ms": w.get("pre_collective_ms"), "individual": w.get("individual_score")} for t, w in flat.items()
    }
    judgement = judge_gpus({t: b for t, b in gpu_beats.items() if b}, gpu_models, work)
    shared = shared_problems(training_hosts)
    paced = pace(flat, gpu_models)

    lo = window.from_ts if window else 0.0
    named = [s.to_dict() for s in stragglers if (s.ts or 0) >= lo]
    analysis = analyse(flat, host_samples, judgement, named, policy, shared=shared, paced=paced)
    hints = tuple(f"{e.task} ({e.host}): fix: {e.message}" for e in events if isinstance(e, ScriptHint))
    analysis = replace(analysis, advice=hints + tuple(analysis.advice)) if hints else analysis
    if stragglers and end:
        # detection needs two slow windows in a row: the event follows the second one, so the
        # windows since ~1.5 windows before the first event are the slow ones
        first = min(x.ts or end for x in stragglers)
        analysis = replace(analysis, suggested_last_s=math.ceil(end - first + 1.5 * policy.window_s))
    return Report(
        run_dir=str(run.path),
        job=plan.job if plan else None,
        window=window,
        workers=workers,
        throughput=throughput(whole),  # the job's: every worker counts the global batch
        gpu_models=_gpu_models(workers.values()),
        gpu_problems=tuple(p.to_dict() for p in judgement.problems),
        gpu_clocks=judgement.models,
        shared_problems=tuple({"kind": p.kind, "detail": p.detail, **p.data} for p in shared),
        pace=paced,
        stragglers=stragglers,
        slowing=slowing,
        roles=_roles(plan, events),
        evaluations=evaluation_report(events).get("evaluations"),  # an evaluator's evaluations, per checkpoint
        analysis=analysis,
        goodput=(g := _goodput(events, records, run, window)),
        loss=curve_report(records),  # the whole run's, like the noise scale (its estimate now)
        noise_scale=noise_report(every_profile),
        reshapes=tuple(reshape_report(events, g).get("reshapes", ())),  # hosts lost for good, what each cost
    )


def _roles(plan: PlanRecord | None, events: list[BaseEvent]) -> Roles | None:
    """A job with roles (plan.json ``strategy``): what happened to each role that does not take the job
    down (restarts in place, a reported evaluator) and the end of the training."""
    if plan is None or not plan.roles:
        return None
    return Roles(plan.strategy, tuple(RoleNote.of(ev) for ev in events if isinstance(ev, RoleFailure | TrainingEnded)))


def _training(beats: list[dict[str, Any]], end: float) -> list[dict[str, Any]]:
    """The heartbeats sent while the task trained (a step done, up to the last step-clock window): a
    GPU idles before and after, and TensorFlow's start-up is busy on every host. None: all of them."""
    trained = [
        b
        for b in beats
        if isinstance(b.get("progress"), dict) and (b["progress"].get("steps") or 0) > 0 and (b.get("ts") or 0) <= end
    ]
    return trained or beats


def _split_by_task(
    records: Iterable[dict[str, Any]],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Each task's step-clock windows and its other records, in file order: one pass (at 4,096 tasks a
    report reads ~190k records)."""
    profiles: dict[str, list[dict[str, Any]]] = {}
    beats: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        out = profiles if rec.get("kind") == "profile" else beats
        rows = out.get(rec["task"])
        if rows is None:
            out[rec["task"]] = [rec]
        else:
            rows.append(rec)
    return profiles, beats


def _goodput(events: list[BaseEvent], records: list[dict[str, Any]], run: RunDir, window: Any) -> Goodput | None:
    """Goodput always splits the whole run's wall time; with --last it says so."""
    g = goodput_report(events, records, json_object(run, run.result_json), run.is_finished())
    if g is not None and window is not None:
        g = g.noted("of the whole run: --last narrows the step-time sections above, not goodput")
    return g


def _round(x: float | None, scale: float = 1.0) -> float | None:
    return None if x is None else round(x * scale, 2)


def _gpu_models(workers: Iterable[WorkerRow]) -> GpuModels:
    """GPU models and memory per host; ``mixed`` when hosts differ (every step waits for the slowest)."""
    per_host = {}
    for w in workers:
        if w.gpus:
            per_host[str(w.host)] = sorted(
                {f"{g.get('name')} ({(g.get('memory_mb') or 0) / 1024:.0f} GiB)" for g in w.gpus}
            )
    return GpuModels(per_host, len({tuple(v) for v in per_host.values()}) > 1)


def analyse(
    workers: dict[str, dict[str, Any]],
    host_samples: dict[str, list[dict[str, Any]]] | None = None,
    gpus: GpuJudgement | None = None,
    named: list[dict[str, Any]] | None = None,
    policy: StragglerPolicy | None = None,
    shared: list[SharedProblem] | None = None,
    paced: Pace | None = None,
) -> Analysis:
    """The job's split, efficiency and advice in plain words: a straggler named from the step clock,
    its host's evidence or its GPUs (now, or by the launcher during the window: ``named``), and a
    problem every host shares (``shared``), come before any "communication-bound" verdict. ``policy``:
    the run's thresholds (plan.json), the live monitor's. ``paced``: mixed GPU models (``pace``)."""
    host_samples, gpus, shared = host_samples or {}, gpus or GpuJudgement(), shared or []
    split = job_split(workers)
    host = host_suspect({t: s for t, s in host_samples.items() if s})
    everywhere = [f"every host: {p.detail}" for p in shared]
    if split is None:
        gpu_lines = [p.text() for p in gpus.problems]
        if host is not None or gpu_lines or everywhere:
            found = [f"{host.task}: {host.cause} — {host.detail}"] if host is not None else []
            return Analysis(None, None, (*found, *gpu_lines, *everywhere))
        if any(w.get("steps") for w in workers.values()):
            why = (
                "no step-clock samples, although training steps were reported: the training was shorter than "
                "one step-clock window (heartbeat.profile_interval_s), the step clock is off (TFCLUSTER_STEPCLOCK=0), "
                "or the steps do not run in a tf.function under a multi-worker MultiWorkerMirroredStrategy"
            )
        else:
            why = (
                "no step-clock samples: run with job.instrument: true and heartbeat.profile_interval_s > 0 "
                "(any MWMS training in a tf.function is instrumented automatically)"
            )
        return Analysis(None, None, (why,))
    step = split.step_ms
    prof = {t: dict(w) for t, w in workers.items() if w.get("pre_collective_ms") is not None and w.get("step_ms")}
    finding = find_straggler(prof, policy or StragglerPolicy())
    finding = _by_model(explain(finding, host_samples, gpus, prof, (host,)), paced)  # host: of the same samples
    advice = []
    if finding is not None:
        waits = (
            f"the others wait ≈{finding.wait_ms:.0f} ms per step for it ({finding.share:.0%} of a step); "
            if not finding.host_only
            else ""
        )
        line = f"{finding.task} is a straggler: {waits}cause: {finding.cause} — {finding.detail}"
        advice.append(with_remedy(line, finding.cause))
    told = finding.detail if finding is not None else ""
    advice += [p.text() for p in gpus.problems if p.text() not in told]  # every GPU problem, once
    advice += everywhere
    for s in named or []:
        if finding is None or finding.task != s.get("task"):
            line = f"{s.get('task')} was named a straggler during this window (cause: {s.get('cause')}); the split"
            advice.append(with_remedy(f"{line} mixes its slow steps with others: see `--last`", s.get("cause")))
    explained = finding is not None or gpus.suspect() is not None or bool(named)
    inflated = inflation_advice(shared, split.allreduce_ms, step)
    if inflated is not None and step > 0 and split.allreduce_ms / step > 0.3:
        advice.append(inflated)
    elif not explained and step > 0 and split.allreduce_ms / step > 0.5:
        advice.append(
            f"communication-bound: {split.allreduce_ms / step:.0%} of each step is the all-reduce itself (no worker "
            "is late and no host reports a starved CPU or a bad link). Larger per-worker batches (fewer all-reduces per "
            "example), NCCL on GPUs, a faster network, or fp16 gradients help"
        )
    if split.input_ms and step > 0 and split.input_ms / step > 0.2:
        advice.append("input-bound: tf.data takes >20% of a step; add .prefetch(AUTOTUNE), parallel map, cache")
    if step > 0 and split.host_ms / step > 0.3:
        advice.append(
            f"framework-bound: {split.host_ms / step:.0%} of each step is spent between steps (the training loop, "
            "callbacks, logging); Keras: steps_per_execution > 1; custom loops: several steps per tf.function call"
        )
    if paced is not None and (what_if := pace_advice(paced)) is not None:
        advice.append(what_if)
    if not advice:
        advice.append("no dominant bottleneck found: work dominates the step, which is what scales")
    local = step - split.waiting_for_slowest_ms - split.allreduce_ms
    efficiency = local / step if step > 0 else None
    return Analysis(round(efficiency, 3) if efficiency is not None else None, split, tuple(advice))


def _by_model(finding: Any, paced: Pace | None) -> Any:
    """A straggler whose "compute" excess is its GPU model's (it works like the other hosts of that
    model, which set the job's pace) gets that cause: the mixed-models advice says what to do."""
    if finding is None or paced is None or finding.cause not in ("compute", "other") or pace_advice(paced) is None:
        return finding
    group = paced.slowest
    if finding.task not in group.tasks or finding.pre_ms.get(finding.task, 0.0) > WORK_RATIO * group.own_work_ms:
        return finding
    return replace(
        finding,
        cause="GPU model",
        detail=(
            f"{paced.pace_model}, on {group.workers} host(s) of this job, does the same work more slowly than the "
            "other models: see the mixed-models advice"
        ),
    )
