"""One straggler policy: built from the spec, kept in plan.json, read by the live monitor and by
`report` alike (an older plan.json without it gets the same defaults)."""

from __future__ import annotations

import json

import pytest
from fakenode import make_plan

from orchestrator.plan import StragglerPolicy
from orchestrator.plan.record import PlanRecord
from orchestrator.runs import RunDir, write_plan
from orchestrator.supervise import Monitor, Policy, Supervisor
from orchestrator.views import report as report_view

TASKS = ["worker:0", "worker:1", "worker:2"]


def _profile(pre: float, step: float = 100.0) -> dict:
    return {
        "pre_collective_ms": pre,
        "step_ms": step,
        "input_ms": 1.0,
        "compute_ms": pre - 1.0,
        "collective_ms": step - pre,
        "steps": 20,
    }


W0 = {"task": {"type": "worker", "index": 0}}  # a version-1 record's task


def _run_dir(tmp_path, plan, pres: list[float], rounds: int = 4) -> RunDir:
    write_plan(RunDir(tmp_path), plan)  # as a launch records it
    lines = [
        {"task": t, "kind": "profile", "ts": 1_800_000_000.0 + r, **_profile(pre)}
        for r in range(rounds)
        for t, pre in zip(TASKS, pres, strict=True)
    ]
    (tmp_path / "heartbeats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return RunDir(tmp_path)


def _monitor_names(policy: Policy, pres: list[float], rounds: int = 4) -> set[str | None]:
    m = Monitor(TASKS, policy, now=0.0)
    named = set()
    for r in range(rounds):
        for t, pre in zip(TASKS, pres, strict=True):
            named |= {v.task for v in m.on_profile(t, _profile(pre), float(r)) if v.kind == "straggler"}
    return named


def test_the_spec_policy_is_in_plan_json_and_the_monitor_judges_with_it():
    loaded, plan = make_plan(3, heartbeat={"straggler_ratio": 3.0, "profile_interval_s": 4, "kill_stragglers": True})
    persisted = json.loads(PlanRecord.from_plan(plan).to_json())
    assert persisted["policy"] == {**StragglerPolicy().to_dict(), "ratio": 3.0, "profile_interval_s": 4.0, "kill": True}
    sup = Supervisor(loaded.spec, plan, None, attempt=0, bus=None, logs=None, heartbeats=None, interrupt=None)  # type: ignore[arg-type]
    assert sup.monitor.policy.stragglers == PlanRecord.from_dict(persisted).policy == plan.policy


def test_monitor_and_report_use_the_same_thresholds(tmp_path, monkeypatch):
    """Fails when they diverge: the live monitor used to leave ``min_share`` out and name a worker
    whose excess is 8 ms of a 100 ms step (8%); report, with min_share 0.1, did not."""
    _, plan = make_plan(3)
    pres = [4.0, 12.0, 4.0]  # 3x the others and 8 ms more: below 10% of the step
    run = _run_dir(tmp_path, plan, pres)
    seen = []
    real = report_view.find_straggler
    monkeypatch.setattr(report_view, "find_straggler", lambda prof, policy: seen.append(policy) or real(prof, policy))
    rep = report_view.build_report(run)
    monitor_policy = Policy(stragglers=plan.policy)
    assert seen == [monitor_policy.stragglers]  # report judged with the plan's policy, as the monitor does
    assert not any(a.startswith("worker:1 is a straggler") for a in rep.advice)
    assert _monitor_names(monitor_policy, pres) == set()
    # ... and both name it once its excess is a real share of the step
    pres = [4.0, 24.0, 4.0]
    rep = report_view.build_report(_run_dir(tmp_path, plan, pres))
    assert any(a.startswith("worker:1 is a straggler") for a in rep.advice)
    assert _monitor_names(monitor_policy, pres) == {"worker:1"}


def test_a_stricter_persisted_policy_holds_for_report_too(tmp_path):
    _, plan = make_plan(3, heartbeat={"straggler_ratio": 8.0})
    pres = [4.0, 24.0, 4.0]  # 6x: a straggler by default, not at ratio 8
    rep = report_view.build_report(_run_dir(tmp_path, plan, pres))
    assert not any(a.startswith("worker:1 is a straggler") for a in rep.advice)
    assert _monitor_names(Policy(stragglers=plan.policy), pres) == set()


@pytest.mark.parametrize(
    ("plan", "window"),
    [
        ({"version": 2, "tasks": []}, StragglerPolicy.profile_interval_s),  # nothing known: the spec's default
        ({"nodes": [{**W0, "env": {"TFCLUSTER_PROFILE_INTERVAL_S": "2"}}]}, 2.0),  # an older plan.json
        ({"nodes": [{**W0, "env": {"TFCLUSTER_PROFILE_INTERVAL_S": "0"}}]}, StragglerPolicy.profile_interval_s),  # off
        (
            {
                "policy": {"profile_interval_s": 3, "ratio": "x"},
                "nodes": [{**W0, "env": {"TFCLUSTER_PROFILE_INTERVAL_S": "2"}}],
            },
            3.0,
        ),
    ],
)
def test_an_older_or_damaged_plan_json_gets_the_defaults_from_the_same_place(plan, window):
    policy = PlanRecord.from_dict({"job": "j", "run_id": "r", **plan}).policy
    assert policy.window_s == window
    assert policy.ratio == StragglerPolicy().ratio and policy.min_share == 0.1
