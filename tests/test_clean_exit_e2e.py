"""When `launch` returns, nothing of the job runs on any host: the launcher waits (bounded, in parallel)
for every node's worker_entry to exit — which it does only once its task's process tree is gone — and
names a host that did not confirm. Back-to-back launches on the network-namespace bed (directly and
through a bastion), checked at the very moment each launch returns; a host whose worker_entry cannot
confirm is reported, not silently left."""

from __future__ import annotations

import json
import signal

import psutil
import pytest
import yaml
from conftest import PY, assert_no_job_processes, job_processes, read_events, run_launch
from testbed_fixtures import requires_netns

pytestmark = [pytest.mark.e2e, requires_netns]

#: A short job that leaves a child behind in its process group (worker_entry must take it down too).
SHORT = ["sh", "-c", f"sleep 30 & exec {PY} -c 'import time; time.sleep(0.3); print(\"done\", flush=True)'"]
LAUNCHES = 8


def _back_to_back(tb, spec, tmp_path, n: int) -> list[dict[str, list[str]]]:
    left = []
    for i in range(n):
        r = run_launch(tb, spec, tmp_path / f"run{i}")
        left.append(job_processes(tb))  # at once: not after a grace period
        assert r.rc == 0, r.stderr[-3000:]
        assert not [e for e in r.events if e["event"] == "exit_unconfirmed"], r.events
        assert_no_job_processes(tb, 10)  # the next launch starts clean even if this one failed the check
    return left


def test_nothing_of_the_job_runs_on_any_host_when_launch_returns(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    spec = tb.write_spec(tmp_path / "spec.yaml", "b2b", SHORT)
    left = _back_to_back(tb, spec, tmp_path, LAUNCHES)
    assert left == [{}] * LAUNCHES, [x for x in left if x]


def test_nothing_runs_on_the_hosts_after_a_run_through_a_bastion(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns", sshd_options={2: ["AllowUsers root@{host0}"]})
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {tb.hosts[2].address}\n  ProxyJump {tb.user}@{tb.hosts[0].address}\n")
    doc = tb.spec_dict("b2b-bastion", SHORT)
    doc["ssh"]["config_file"] = str(cfg)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    left = _back_to_back(tb, spec, tmp_path, LAUNCHES)
    assert left == [{}] * LAUNCHES, [x for x in left if x]


def test_a_host_that_cannot_confirm_is_named(testbed_factory, tmp_path):
    """worker:1's command stops its own worker_entry (SIGSTOP): the task is lost, the job torn down, and
    at the end its host cannot confirm that anything is gone — a warning names it (and it is true)."""
    tb = testbed_factory(2, mode="netns")
    cmd = ["sh", "-c", 'if [ "$TFCLUSTER_TASK_INDEX" = 1 ]; then kill -STOP $PPID; fi; sleep 60']
    spec = tb.write_spec(tmp_path / "spec.yaml", "unconfirmed", cmd, heartbeat={"interval_s": 0.5, "timeout_s": 3})
    try:
        r = run_launch(tb, spec, tmp_path / "run", timeout=120)
        assert r.rc == 3, r.stderr[-3000:]
        warned = [e for e in read_events(r.run_dir) if e["event"] == "exit_unconfirmed"]
        assert [(e["task"], e["host"]) for e in warned] == [("worker:1", tb.hosts[1].address)], warned
        assert f"{tb.hosts[1].address} did not confirm that worker:1's processes are gone" in r.stderr
        still = job_processes(tb)
        assert tb.hosts[1].name in still and tb.hosts[0].name not in still, still  # the warning was true
        assert json.loads((r.run_dir / "result.json").read_text())["state"] == "failed"
    finally:
        for proc in tb.host_processes(1):
            try:
                if proc.name() != "sshd":
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
            except psutil.Error:
                pass
    assert_no_job_processes(tb, 10)
