"""A reshape of a job with a chief and two tasks on one host (issue 34), on the namespace test bed with
real TensorFlow MWMS: the chief's host, which also runs a worker, is cut for good in epoch 2; with no
spare and ``min_workers: 2`` the job goes on without both of its tasks, a worker of the first host left
becomes the chief, and it finishes from the backup on the planned global batch."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import PY, assert_no_job_processes, backed_up_epochs, read_events, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

pytestmark = [pytest.mark.e2e, requires_netns]

EPOCH_RE = re.compile(r"\] epoch (\d+)/(\d+) .* batch=(\d+)")


def _epochs(path) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(3))) for m in EPOCH_RE.finditer(path.read_text())]


def test_the_chiefs_host_with_two_tasks_cut_for_good_a_worker_takes_the_chief(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    backup = tmp_path / "backup"  # the hosts share this file system: the test reads the chief's backup
    command = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "4", "--steps-per-epoch", "30"]
    doc = tb.spec_dict(
        "elastic-roles",
        [*command, "--backup"],
        heartbeat={"interval_s": 0.5, "timeout_s": 5.0},
        restart={"backup_dir": str(backup), "max_restarts": 1, "min_workers": 2},
    )
    doc["hosts"][0]["roles"] = {"chief": 1, "worker": 1}
    for h in doc["hosts"][1:]:
        h["roles"] = {"worker": 1}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_dir = tmp_path / "run"
    proc = start_launch(tb, spec, run_dir, "-q", "--no-gather")
    try:
        wait_for(lambda: backed_up_epochs(backup) >= 1, 300, "the backup of epoch 1 written")
        tb.cut(tb.hosts[0])  # the chief's host, with worker:0, in epoch 2, for good
        _, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
        result = json.loads((run_dir / "result.json").read_text())
        first, second = result["attempts"]
        assert first["root_cause"]["host"] == tb.hosts[0].address and first["root_cause"]["kind"] == "lost"
        assert {t: r["host"] for t, r in second["tasks"].items()} == {
            "chief:0": tb.hosts[1].address,  # worker:1 before: the first host left has the chief now
            "worker:0": tb.hosts[2].address,
        }
        (reshaped,) = [e for e in read_events(run_dir) if e["event"] == "reshaped"]
        assert (reshaped["host"], reshaped["spare_in"]) == (tb.hosts[0].address, None)
        assert (reshaped["workers_before"], reshaped["workers_after"]) == (4, 2)
        plan = json.loads((run_dir / "plan.json").read_text())
        assert plan["attempt"] == 1 and [t["host"] for t in plan["tasks"]] == [h.address for h in tb.hosts[1:]]
        for task in ("chief-0", "worker-0"):
            after = _epochs(run_dir / "logs" / f"{task}.attempt-1.log")
            # resumed after the backed-up epoch 1 (not from epoch 1), on the planned global batch: 4 x 64 over 2
            assert after[0][0] > 1 and after[-1][0] == 4, after
            assert {b for _, b in after} == {128}, after
        assert_no_job_processes(tb, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        tb.restore(tb.hosts[0])
