"""Weak vs strong scaling from the batch each size really ran (issue 32, item 2): the median step's batch,
so an epoch's partial last batch (the TF tutorial's 6,000 examples in global batches of 192: 31 steps of
192 and one of 48) does not make weak scaling read as strong. Pure."""

from __future__ import annotations

import pytest

from orchestrator.views import batches as bt
from orchestrator.views import scale as sv
from worker_entry.instrument.stepclock.timeline import StepSplit, median_batch


def _steps(examples):
    return [StepSplit(fn=1, end=float(i), step_ms=10.0, parts={}, examples=e) for i, e in enumerate(examples)]


def test_the_median_step_batch_leaves_the_partial_last_batch_out():
    epoch = [192.0] * 31 + [48.0]
    assert sum(epoch) == 6000 and sum(epoch) / len(epoch) / 3 == pytest.approx(62.5)  # the mean: 62 per worker
    assert median_batch([_steps(epoch)]) == 192.0
    # two local replicas, each carrying its share of the replicas in sync: summed
    assert median_batch([_steps([96.0] * 31 + [24.0]), _steps([96.0] * 31 + [24.0])]) == 192.0
    assert median_batch([_steps([192.0, None])]) is None  # a step whose examples are unknown
    assert median_batch([[]]) is None


def test_a_runs_global_batch_is_its_windows_median_step_batch_else_the_mean():
    profiles = [{"kind": "profile", "batch_p50": 192.0}] * 3 + [{"kind": "heartbeat"}]
    assert bt.global_batch(profiles, 1875.0, 10.0) == (192.0, "median step")
    assert bt.global_batch([{"kind": "profile"}], 1875.0, 10.0) == (187.5, "mean step")
    assert bt.global_batch([], None, 10.0) == (None, None)


def _size(n, batch, source="median step"):
    return {
        "workers": n,
        "steps_per_s": 10.0,
        "examples_per_s": 10.0 * batch,
        "global_batch": batch,
        "per_worker_batch": round(batch / n),
        "batch_from": source,
    }


def test_the_tutorials_sweep_is_called_weak_scaling():
    """64 per worker at 1, 2 and 3 workers, the global batch 64, 128, 192: weak, as asked, never "strong"."""
    sizes = [_size(1, 64), _size(2, 128), _size(3, 192)]
    cmp = sv.compare(sizes, strong=False)
    assert cmp["measured_scaling"] == "weak"
    (note,) = cmp["notes"]
    assert note.startswith("weak scaling: the script kept its per-worker batch (64 at 1, 64 at 2, 64 at 3)")
    assert "partial last batch left out" in note and "strong" not in note
    text = sv.sweep_text({**cmp, "mode": "weak", "sizes": sizes, "advice": []})
    assert "weak scaling: the script kept its per-worker batch" in text


def test_the_mean_batch_of_before_would_have_read_as_strong_and_now_says_neither():
    """What `scale` saw before (62 at 3 from the mean) is no longer called strong scaling either."""
    sizes = [_size(1, 64, "mean step"), _size(2, 128, "mean step"), _size(3, 187.5, "mean step")]
    cmp = sv.compare(sizes, strong=False)
    assert cmp["measured_scaling"] is None and not any("measured strong scaling" in n for n in cmp["notes"])


def test_strong_and_mismatched_asks():
    fixed = [_size(1, 192), _size(2, 192), _size(3, 192)]
    assert bt.scaling_of({s["workers"]: (s["global_batch"], s["per_worker_batch"]) for s in fixed}) == "strong"
    (note,) = sv.compare(fixed, strong=False)["notes"]
    assert "so this measured strong scaling" in note
    (note,) = sv.compare([_size(1, 64), _size(2, 128)], strong=True)["notes"]
    assert "so this measured weak scaling" in note and "sweep_batch_size" in note
    (note,) = sv.compare(fixed, strong=True)["notes"]
    assert note.startswith("strong scaling: the script kept its global batch")
