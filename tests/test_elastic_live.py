"""The load generator loses hosts for good under the launcher's real Job and supervisor (issue 34 item 9,
bench/elastic_live.py): a silent rank is judged lost, the policy reshapes with the spare, then (no
spare left, min_workers) with one worker fewer; the run's report gives each loss's time to training
again. Real protocol, real supervisor; the nodes are the load generator's."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import elastic_live


def test_hosts_lost_for_good_are_replaced_then_the_job_shrinks(tmp_path):
    r = elastic_live.run(4, 1, 2, 2, 1.0, tmp_path / "run", timeout_s=3.0)
    assert r["state"] == "succeeded", r
    assert r["hosts_lost"] == 2 and r["reshapes"] >= 2 and r["workers_end"] <= 3, r
    # each loss: from the lost rank's last heartbeat, past the 3-s timeout, to the next attempt's first step
    assert len(r["again"]) >= 2 and all(3.0 < x < 60 for x in r["again"]), r
