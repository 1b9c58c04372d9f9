"""The Young-Daly backup interval (issue 34.9): the formula, its inputs from a run's events (the copies'
save cost, failures over the wall time, the interval between copies) or from the user, the text and
the JSON of `report` and `predict`."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli

from orchestrator.events import kinds
from orchestrator.views.backup_interval import (
    advice_lines,
    backup_advice,
    interval_now,
    lost_fraction,
    run_mtbf,
    save_cost,
    young_daly,
)
from orchestrator.views.goodput import goodput, goodput_lines
from orchestrator.views.goodputmodel import Goodput


def copied(ts: float, attempt: int = 0, save_s: float = 2.0, copy_s: float = 5.0) -> kinds.BackupCopied:
    return kinds.BackupCopied(
        ts=ts,
        task="worker:0",
        host="h0",
        attempt=attempt,
        copy="c",
        files=3,
        bytes=10,
        fetched=1,
        save_s=save_s,
        copy_s=copy_s,
    )


def finished(ts: float, attempt: int, state: str) -> kinds.AttemptFinished:
    return kinds.AttemptFinished(ts=ts, attempt=attempt, state=state, root_cause=None)


def test_the_optimum_is_the_square_root_of_twice_the_save_cost_times_the_mtbf():
    assert young_daly(30.0, 6 * 3600) == pytest.approx(math.sqrt(2 * 30 * 21600)) == pytest.approx(1138.4, abs=0.1)
    assert young_daly(0.0, 3600) == 0.0
    # it is the minimum of the first-order loss C/T + T/2M: a little more or less loses more
    c, m = 30.0, 21600.0
    best = young_daly(c, m)
    assert lost_fraction(best, c, m) < lost_fraction(best * 0.8, c, m)
    assert lost_fraction(best, c, m) < lost_fraction(best * 1.25, c, m)
    assert lost_fraction(best, c, m) == pytest.approx(math.sqrt(2 * c / m))  # at the optimum: √(2C/M)
    with pytest.raises(ValueError):
        young_daly(1.0, 0.0)
    with pytest.raises(ValueError):
        lost_fraction(0.0, 1.0, 10.0)


def test_the_inputs_come_from_the_copies_and_the_failed_attempts():
    copies = [copied(100, save_s=1.0), copied(160, save_s=3.0), copied(220, save_s=2.0), copied(400, attempt=1)]
    assert save_cost(copies) == {"value_s": 2.0, "source": "the chief's saves (first to last file)", "n": 4}
    # without a save span (every file of a save written at once): the copies' own time stands in
    flat = [copied(1, save_s=0.0, copy_s=4.0), copied(2, save_s=0.0, copy_s=6.0)]
    assert save_cost(flat)["value_s"] == 5.0 and save_cost(flat)["source"] == "the copies' duration"
    assert save_cost([]) is None
    # the gaps between copies of one attempt, never across attempts
    assert interval_now(copies) == 60.0 and interval_now([copied(5)]) is None
    events = [finished(10, 0, "failed"), finished(20, 1, "failed"), finished(30, 2, "succeeded")]
    assert run_mtbf(events, 7200.0)["value_s"] == 3600.0
    assert run_mtbf(events[2:], 7200.0)["value_s"] is None  # no failure: no MTBF


def test_the_advice_from_the_run_and_from_the_user():
    events = [copied(100, save_s=2.0), copied(160, save_s=2.0), finished(200, 0, "failed"), copied(300, attempt=1)]
    a = backup_advice(events, 3600.0)
    assert a["save_cost"]["value_s"] == 2.0 and a["mtbf"]["value_s"] == 3600.0
    assert a["optimal_interval_s"] == pytest.approx(120.0)  # √(2 · 2 · 3600)
    assert a["interval_now_s"] == 60.0 and a["lost_now"] > a["lost_at_optimum"]
    text = "\n".join(advice_lines(a))
    assert "back up every 2.0 min" in text and "now every 1.0 min" in text and "save less often" in text
    given = backup_advice(events, 3600.0, mtbf_s=6 * 3600.0, save_s=30.0)
    assert given["optimal_interval_s"] == pytest.approx(math.sqrt(2 * 30 * 21600), abs=0.01)
    assert given["mtbf"]["source"] == given["save_cost"]["source"] == "given"
    # a run without a failure: the MTBF is asked for
    calm = backup_advice(events[:2], 3600.0)
    assert calm["optimal_interval_s"] is None and "MTBF" in calm["missing"]
    assert "predict --mtbf" in "\n".join(advice_lines(calm))
    assert backup_advice([], 3600.0) is None and advice_lines(None) == []


def test_report_shows_the_advice_in_its_goodput_section():
    start = kinds.JobStarted(ts=0.0, job="j", run_id="r", run_dir="d", tasks=2, attempt_limit=2)
    events = [start, copied(100), copied(160), finished(1800, 0, "failed"), copied(2000, attempt=1)]
    events.append(kinds.JobFinished(ts=3600.0, state="succeeded", wall_time_s=3600.0, run_dir="d", root_cause=None))
    g = goodput(events, [], {})
    assert g["backup_interval"]["mtbf"]["value_s"] == 3600.0
    assert g["backup_interval"]["optimal_interval_s"] == pytest.approx(120.0)
    assert any("back up every 2.0 min" in line for line in goodput_lines(Goodput.of(g)))


def test_predict_takes_the_mtbf_and_the_save_cost_from_the_user(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    bad = run_cli("predict", str(run), "--mtbf", "often")
    assert bad.returncode != 0 and "--mtbf" in bad.stderr
    from orchestrator.cli.predict import _backup_interval

    class Args:
        mtbf, save_cost = "6h", "30s"

    (run / "events.jsonl").write_text(json.dumps(copied(5.0).to_dict()) + "\n")
    a = _backup_interval(run, Args())
    assert a["optimal_interval_s"] == pytest.approx(1138.420, abs=0.01)
    assert a["mtbf"] == {"value_s": 21600.0, "source": "given"}
