"""Goodput where users read it: TensorBoard, the HTML page, `report --json` and its text; hostile and
truncated records; one e2e run on the test bed whose worker is killed mid-run and restarted from its
BackupAndRestore backup; the others' wait for an input-bound worker booked as input.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re

import goodput_runs
import pytest
from conftest import run_cli
from goodput_runs import T0, _profile, _sum, restart_run

from orchestrator.events import BaseEvent, event_from_dict
from orchestrator.runs import RunDir
from orchestrator.views.goodput import CATEGORIES, goodput, goodput_lines
from orchestrator.views.goodputmodel import Goodput
from orchestrator.views.records import clean_heartbeat
from orchestrator.views.report import build_report, report_text


def _plan() -> dict:
    return {"job": "gp", "nodes": [{"host": f"10.0.0.{i}", "task": {"type": "worker", "index": i}} for i in (0, 1)]}


def _write_run(path, events, beats, result, plan=None) -> RunDir:
    plan = _plan() if plan is None else plan
    (path / "plan.json").write_text(json.dumps(plan))
    lines = (e.to_dict() if isinstance(e, BaseEvent) else e for e in events)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (path / "heartbeats.jsonl").write_text("".join(json.dumps(b) + "\n" for b in beats))
    if result is not None:
        (path / "result.json").write_text(json.dumps(result))
    return RunDir(path)


def test_the_cost_of_a_failure_is_in_tensorboard_and_the_html_page(tmp_path):
    """The same figures as the report's, as TensorBoard scalars at the run's end and on the HTML page."""
    from orchestrator.views.htmlpage import Page
    from orchestrator.views.tensorboard import end_scalars

    run = _write_run(tmp_path, *restart_run())
    _, _, values = end_scalars(run)
    assert values["recovery/loss_to_training_s"] == 10 and values["recovery/work_redone_steps"] == 250
    assert values["recovery/failures"] == 1 and values["recovery/hosts_lost"] == 0
    assert values["goodput/redone_s"] == pytest.approx(6) and values["goodput/host_lost_s"] == 0
    page = Page("t")
    page.goodput_bar(build_report(run).goodput)
    html = page.render()
    assert "work redone: training since the last backup: 6.0 s" in html
    assert "attempt 0 (restart in place): loss to training again 10.0 s; work redone 6.0 s (250 steps reported)" in html


def test_report_json_and_text_carry_goodput(tmp_path):
    run = _write_run(tmp_path, *restart_run())
    rep = build_report(run)
    assert rep.goodput.seconds["productive_s"] == pytest.approx(22.8)
    text = report_text(rep)
    assert "goodput 33.3% of 68.5 s wall time:" in text
    assert re.search(r"work redone: training since the last backup\s+6\.0 s\s+8\.8%", text)
    assert re.search(r"restarting in place after a failure\s+3\.0 s\s+4\.4%", text)
    assert "attempt 0 (restart in place): loss to training again 10.0 s; work redone 6.0 s (250 steps reported)" in text
    assert "attempt 0: lost 6.0 s of training (the next attempt resumed at epoch 2)" in text
    r = run_cli("report", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["goodput"]["failure_s"] == pytest.approx(3)
    assert json.loads(r.stdout)["goodput"]["recovery"]["work_redone_steps"] == 250
    narrowed = build_report(run, last_s=10)  # --last narrows the step times; goodput stays whole-run
    assert narrowed.goodput.wall_s == rep.goodput.wall_s
    assert "(of the whole run: --last narrows" in report_text(narrowed)


HOSTILE = ["x", None, [], {}, [1, "a"], {"ts": "x"}, -5, 1e300, True, "NaN", 3.5, 0]


def _damage(rec, rng: random.Random):
    """Replace a random field (also nested ones) with a hostile value, or drop it."""
    target = rec
    while isinstance(target, dict) and target and rng.random() < 0.5:
        nested = [v for v in target.values() if isinstance(v, dict)]
        if not nested:
            break
        target = rng.choice(nested)
    if isinstance(target, dict) and target:
        key = rng.choice(sorted(target))
        if rng.random() < 0.2:
            del target[key]
        else:
            target[key] = copy.deepcopy(rng.choice(HOSTILE))
    return rec


def test_hostile_and_truncated_records_never_traceback(tmp_path):
    events, beats, result = restart_run()
    rng = random.Random(14)
    for i in range(150):
        d = tmp_path / f"r{i}"
        d.mkdir()
        ev, bs, res = copy.deepcopy(([e.to_dict() for e in events], beats, result))
        for recs in (ev, bs, res["attempts"]):
            for rec in rng.sample(recs, k=min(len(recs), rng.randint(1, 6))):
                _damage(rec, rng)
        if i % 3 == 0:
            _damage(res, rng)
        plan = _plan()
        for rec in (plan, *plan["nodes"]) if i % 4 == 0 else ():
            _damage(rec, rng)
        run = _write_run(d, ev, bs, res if i % 5 else rng.choice(HOSTILE), plan)
        with open(run.heartbeats_jsonl, "a") as f:
            f.write('{"task": "worker:0", "kind": "prof')  # torn by a crash mid-write
        with open(run.events_jsonl, "a") as f:
            f.write("[1, 2]\n\x00\xff garbage\n")
        rep = build_report(run)
        report_text(rep)
        g = rep.goodput.to_dict() if rep.goodput else None
        if g is not None:
            assert all(math.isfinite(g[k]) and g[k] >= 0 for k in CATEGORIES), g
            assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01, rel=1e-9)
    # damaged plan.json and result.json, and nothing else
    d = tmp_path / "bare"
    d.mkdir()
    (d / "plan.json").write_text('{"job": "x", "nodes": [1, {"task": "w"}, {"task": {}, "env": []}]')
    (d / "result.json").write_text("[]")
    rep = build_report(RunDir(d))
    assert rep.goodput is None and "goodput" not in report_text(rep)


def test_cleaning_keeps_good_records_and_unknown_fields():
    beat = {"task": "worker:0", "ts": T0, "seq": 1, "new_field": "from a newer launcher", "progress": {"steps": 3}}
    assert clean_heartbeat(dict(beat)) == beat
    assert clean_heartbeat({**beat, "progress": {"steps": "3"}}) == {k: v for k, v in beat.items() if k != "progress"}
    assert clean_heartbeat({**beat, "ts": float("nan")}) is None
    assert clean_heartbeat({**beat, "task": ["worker:0"]}) is None
    assert event_from_dict({"ts": T0, "event": "attempt_started", "attempt": 1, "new": "field"}).attempt == 1
    with pytest.raises(ValueError, match=r"^attempt_started\.ts: expected"):
        event_from_dict({"ts": "T0", "event": "attempt_started", "attempt": 1})
    damaged = {"ts": T0, "event": "attempt_finished", "attempt": 0, "state": "failed", "root_cause": "x"}
    assert event_from_dict(damaged).root_cause is None  # the event stays: goodput needs it


# --- e2e: a real run whose worker is killed mid-run and restarted from its backup --------------------


@pytest.mark.e2e
def test_goodput_of_a_real_run_with_a_restart(restarted_run):
    """worker:1 SIGKILLed once 2 of 6 epochs are backed up, the job restarted and resumed
    (``shared_runs.restarted_run``, the run test_restart_e2e asserts on too)."""
    run_dir = restarted_run.run_dir
    assert restarted_run.rc == 0, restarted_run.stderr[-3000:]  # (the fixture saw no job process left)
    from orchestrator.runs import RunDir
    from orchestrator.views.report import build_report
    from orchestrator.views.runsummary import read_summary

    saved = read_summary(RunDir(run_dir))  # the run's end wrote RUN/summary.json, and report reads it:
    assert saved is not None and saved.report == build_report(RunDir(run_dir))  # the records' report
    r = run_cli("report", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["goodput"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["restarts"] == 1 and g["finished"] is True
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    first, second = g["attempts"]
    assert (first["state"], second["state"]) == ("failed", "succeeded")
    assert first["startup_s"] > 0 and second["startup_s"] > 0  # TensorFlow starts again after the restart
    assert g["failure_s"] > 0 and first["until_next_attempt_s"] > 0
    assert "resumed at epoch" in first["backup"] and first["training_s"] > 0  # epochs 1-2 were kept
    assert g["productive_s"] > 0 and 0 < g["goodput"] < 1
    assert all(g[k] >= 0 for k in CATEGORIES)
    text = run_cli("report", str(run_dir)).stdout
    assert "goodput" in text and "attempt 0: lost" in text


def test_the_others_wait_for_an_input_bound_worker_is_booked_as_input_naming_it(monkeypatch):
    """worker:1 is 4 ms per step late because its input pipeline takes 8 ms where worker:0's takes 4: the
    4 ms worker:0 waits for it inside the all-reduce is input's cost (issue 32: "how much did input cost
    me"), named, and no longer "waiting for the slowest worker"."""
    base = goodput(*restart_run())

    plain = _profile

    def slow_input(ts: float, task: str) -> dict:
        rec = plain(ts, task)
        if task == "worker:1":
            rec.update(input_ms=8.0, compute_ms=6.0)  # the same 14 ms before the all-reduce, its excess all input
        return rec

    monkeypatch.setattr(goodput_runs, "_profile", slow_input)  # what restart_run builds its records with
    g = goodput(*restart_run())
    assert _sum(g) == pytest.approx(g["wall_s"], abs=0.01)
    assert g["productive_s"] == pytest.approx(base["productive_s"])  # the same time, booked to its cause
    assert g["straggler_wait_s"] == pytest.approx(0.0, abs=1e-6)
    assert g["input_stall_s"] == pytest.approx(base["input_stall_s"] + base["straggler_wait_s"])
    assert g["input_waits"] == {"worker:1": pytest.approx(7.6)}
    assert base["input_waits"] == {}  # a worker late in its compute: still the slowest worker's wait
    lines = "\n".join(goodput_lines(Goodput.of(g)))
    assert "of which the others waiting for worker:1's input" in lines and "7.6 s" in lines
