"""The 1,024-task elastic simulation's pure parts (bench/elastic_model.py, issue 34 item 9): training with
saves, the loss process, and whole runs decided by the launcher's real attempt policy."""

from __future__ import annotations

import math
import random
import statistics
import sys
from dataclasses import replace

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from elastic_model import SimConfig, next_loss, simulate, sweep, train, young_daly_s

QUIET = SimConfig(tasks=16, spares=0, loss_every_s=1e12, backup_every_s=10.0, save_s=2.0, horizon_s=1000.0)


def test_training_saves_every_interval_and_loses_what_came_after_the_last_save():
    cfg = replace(QUIET, backup_every_s=10.0, save_s=2.0)
    # 0-10 train, 10-12 save, 12-22 train, 22-24 save, 24-25 train
    assert train(0.0, 25.0, cfg, 0.0) == (21.0, 1.0, 24.0, 2)
    # stopped inside the second save: it never completed, the 10 s before it are lost
    assert train(0.0, 23.0, cfg, 0.0) == (20.0, 10.0, 12.0, 1)
    # resumed 4 s after a save: the next one comes 6 s in
    assert train(100.0, 107.0, cfg, 4.0) == (6.0, 10.0, -math.inf, 0)
    assert train(100.0, 105.0, cfg, 4.0) == (5.0, 9.0, -math.inf, 0)


def test_losses_come_at_the_planned_rate_and_less_often_for_fewer_workers():
    cfg = replace(QUIET, tasks=1024, loss_every_s=120.0)
    rng = random.Random(1)
    full = statistics.fmean(next_loss(rng, 0.0, cfg, 1024) for _ in range(20000))
    half = statistics.fmean(next_loss(rng, 0.0, cfg, 512) for _ in range(20000))
    assert full == pytest.approx(120.0, rel=0.05) and half == pytest.approx(240.0, rel=0.05)
    assert next_loss(rng, 5.0, cfg, 0) == math.inf


def test_without_losses_goodput_is_what_startup_and_saves_leave():
    r = simulate(QUIET)
    # startup 30 s, then 970 s: 80 saves of 2 s (every 10 s of training: 81 x 12 = 972 > 970)
    assert (r.losses, r.saves, r.state) == (0, 80, "running")
    assert r.goodput == pytest.approx((970 - 80 * 2) / 1000)


def test_spares_replace_lost_hosts_until_none_is_left_then_the_policy_ends_the_run_saying_why():
    cfg = replace(QUIET, spares=2, loss_every_s=600.0, horizon_s=24 * 3600.0, backup_every_s=60.0)
    r = simulate(cfg, seed=3)
    assert (r.reshapes, r.losses, r.state, r.workers) == (2, 3, "failed", 16)
    assert "no spare host is left: 15 worker(s) would remain, below restart.min_workers (16)" in r.ended_why
    # each loss that trained again: detection + recovery + startup at least (more when another came meanwhile)
    assert r.loss_to_training_s and min(r.loss_to_training_s) == pytest.approx(10 + 8 + 30)
    assert len(r.redone_s) == 3 and all(0 <= x <= 60 for x in r.redone_s)


def test_min_workers_shrinks_one_host_a_loss_and_a_job_that_restarts_in_place_cannot_start_again():
    cfg = replace(QUIET, min_workers=2, loss_every_s=600.0, horizon_s=3 * 3600.0, backup_every_s=60.0)
    r = simulate(cfg, seed=5)
    assert r.state == "running" and r.losses > 0 and r.workers == 16 - r.losses == 16 - r.reshapes
    before = simulate(replace(cfg, min_workers=None), seed=5)  # no spare, no shrinking: as before issue 34
    assert (before.state, before.losses, before.reshapes) == ("failed", 1, 0)
    assert before.ended_why.startswith("start_failed: cannot reach node")


def test_the_young_daly_advice_is_at_the_swept_goodput_optimum():
    cfg = replace(QUIET, spares=0, min_workers=8, loss_every_s=1800.0, save_s=30.0, horizon_s=48 * 3600.0)
    rows = sweep(cfg, (0.25, 0.5, 1.0, 2.0, 4.0), seeds=8)
    best = max(rows, key=lambda r: r["goodput"])
    assert best["factor"] in (0.5, 1.0, 2.0)
    at = next(r for r in rows if r["factor"] == 1.0)
    assert at["goodput"] >= best["goodput"] - 0.02
    assert at["interval_s"] == pytest.approx(young_daly_s(30.0, 1800.0), abs=0.1)
    assert rows[0]["goodput"] < at["goodput"] and rows[-1]["goodput"] < at["goodput"]  # both ends cost
