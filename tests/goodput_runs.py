"""Synthetic runs for the goodput tests: progress and step-clock records of two workers, events, and a
run whose worker:1 is killed and restarted from a backup."""

from __future__ import annotations

from orchestrator.events import BaseEvent, event_from_dict
from orchestrator.views.goodput import CATEGORIES

T0 = 1_800_000_000.0
TASKS = ("worker:0", "worker:1")


def _sum(g: dict) -> float:
    return sum(g[k] for k in CATEGORIES)


def _progress(ts: float, steps: int, epoch: int | None, task: str) -> dict:
    prog = {"steps": steps, "ts": ts, "phase": "train", "step_time_s": 0.02}
    if epoch is not None:
        prog["epoch"] = epoch
    return {"task": task, "ts": ts + 0.3, "seq": int(ts - T0), "state": "running", "progress": prog}


def _profile(ts: float, task: str) -> dict:
    """20 ms steps: 4 ms input; worker:0 waits 4 ms for worker:1 inside the 6 ms all-reduce."""
    pre, coll = (10.0, 10.0) if task == "worker:0" else (14.0, 6.0)
    return {
        "task": task,
        "kind": "profile",
        "ts": ts,
        "steps": 100,
        "step_ms": 20.0,
        "input_ms": 4.0,
        "compute_ms": pre - 4.0,
        "collective_ms": coll,
        "update_ms": 0.0,
        "host_ms": 0.0,
        "other_ms": 0.0,
        "pre_collective_ms": pre,
    }


def _training(t0: float, t1: float, epoch_of, profiles: bool = True) -> list[dict]:
    """Training from t0 to t1 on both workers at 50 steps/s: progress records every second in (t0, t1],
    profiles every 2 s."""
    out = []
    for i in range(1, int(t1 - t0) + 1):
        ts = t0 + i
        for task in TASKS:
            out.append(_progress(T0 + ts, 50 * i, epoch_of(ts), task))
            if profiles and i % 2 == 1:
                out.append(_profile(T0 + ts, task))
    return out


def _ev(t: float, event: str, **kw) -> BaseEvent:
    """An event as the views read it from events.jsonl (validated: a fixture must be a whole record)."""
    return event_from_dict({"ts": T0 + t, "event": event, **kw})


def restart_run(profiles: bool = True, epochs: bool = True) -> tuple[list[BaseEvent], list[dict], dict]:
    """Attempt 0 trains epochs 0-2 (10 s each from t=10) and is killed at t=35, in epoch 2; attempt 1
    starts at t=38, resumes at epoch 2 (its first step at t=45) and succeeds; gather 66.1-68."""
    events = [
        _ev(0, "job_started", job="gp", run_id="gp-1", run_dir="runs/gp-1", tasks=2, attempt_limit=2),
        _ev(0.5, "connected", hosts=2, seconds=0.5),
        _ev(1, "attempt_started", attempt=0),
        _ev(35, "teardown", reason="worker:1 killed", grace_s=1.0),
        _ev(36, "attempt_finished", attempt=0, state="failed", root_cause={"kind": "signal", "ts": T0 + 35}),
        _ev(36.5, "restart", attempt=1, max_attempts=2, reason="worker:1 killed"),
        _ev(38, "attempt_started", attempt=1),
        _ev(66, "attempt_finished", attempt=1, state="succeeded", root_cause=None),
        _ev(66.1, "gather_started", attempts=2),
        _ev(68, "gather_finished", files=3, bytes=300, dest="runs/gp-1", already_verified=0, skipped=0, errors=0),
        _ev(68.5, "job_finished", state="succeeded", wall_time_s=68.5, run_dir="runs/gp-1", root_cause=None),
    ]
    ep0 = (lambda t: int((t - 10) // 10)) if epochs else (lambda t: None)
    ep1 = (lambda t: 2 + int((t - 45) // 10)) if epochs else (lambda t: None)
    beats = _training(10, 34, ep0, profiles) + _training(45, 64, ep1, profiles)
    result = {
        "state": "succeeded",
        "started_ts": T0,
        "ended_ts": T0 + 68.4,
        "attempts": [
            {"attempt": 0, "state": "failed", "started_ts": T0 + 1, "ended_ts": T0 + 36, "root_cause": {"ts": T0 + 35}},
            {"attempt": 1, "state": "succeeded", "started_ts": T0 + 38, "ended_ts": T0 + 66, "root_cause": None},
        ],
    }
    return events, beats, result
