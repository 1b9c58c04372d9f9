"""bench/gradnorm_time.py's statistics (pure logic): the distribution-free interval of a median that
decides whether the norms' cost was resolved, and the verdict built on it."""

from __future__ import annotations

import random
import statistics
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from gradnorm_time import median_ci, summary


def test_the_interval_is_the_binomial_order_statistics_of_the_textbook():
    # n = 10: the 2nd and 9th values; n = 20: 6th and 15th; n = 60: 22nd and 39th (1-based)
    assert median_ci(list(range(10))) == (1, 8)
    assert median_ci(list(range(20))) == (5, 14)
    assert median_ci(list(range(60))) == (21, 38)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95 %: the whole range


def test_the_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(7)
    covered = 0
    for _ in range(2000):
        lo, hi = median_ci([rng.expovariate(1.0) for _ in range(41)])  # skewed; true median ln 2
        covered += lo <= 0.6931471805599453 <= hi
    assert 0.93 <= covered / 2000 <= 0.995


def test_a_cost_is_resolved_only_when_its_interval_excludes_zero():
    rng = random.Random(3)
    noise = [rng.gauss(0.0, 5.0) for _ in range(400)]
    shifted = summary([x + 3.0 for x in noise])
    assert shifted["resolved"] and shifted["ci95"][0] > 0 < shifted["median"]
    null = summary([x - statistics.median(noise) for x in noise])
    assert not null["resolved"] and null["ci95"][0] < 0 < null["ci95"][1]
