"""Prometheus metrics of a running job, scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from fakenode import FakeBackend, FakeNode, make_plan, stopped
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from orchestrator.job import Job, LaunchOptions
from worker_entry import protocol as p


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples, name, **labels):
    for got, v in samples.get(name, []):
        if all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


def test_a_running_job_is_scraped_with_per_task_and_job_metrics(tmp_path):
    def trains(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.send(p.Profile(steps=20, step_ms=20.0, input_ms=2.0, compute_ms=8.0, collective_ms=10.0))
        stopped(n, n.run_until_stopped(beats=0.05, steps=5, state="running"))

    loaded, plan = make_plan(2, metrics={"port": 0})
    backend = FakeBackend({"worker:0": trains, "worker:1": trains})
    job = Job(
        loaded, plan, LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False), backend
    )
    seen: dict = {}

    def complete(got: dict) -> bool:
        """Every figure the test asserts is there for every task (each task's rates appear when its
        own progress has spanned a second: the tasks are not in step)."""
        return all(
            (value(got, name, task=task) or 0) > 0
            for task in ("worker:0", "worker:1")
            for name in (
                "tfcluster_task_steps",
                "tfcluster_task_steps_per_second",
                "tfcluster_task_examples_per_second",
            )
        ) and all(
            value(got, "tfcluster_task_step_part_seconds", task=t, part="collective") for t in ("worker:0", "worker:1")
        )

    def scraped() -> bool:
        launcher = tmp_path / "run" / "launcher.json"
        info = json.loads(launcher.read_text()) if launcher.exists() else {}
        got = scrape(info["metrics_url"]) if "metrics_url" in info else {}
        if complete(got):
            seen.update(got)
        return complete(got)

    def scrape_then_stop() -> None:
        try:
            wait_for(scraped, 60, "every figure of every task on /metrics", interval=0.2)
        finally:
            job.interrupt.trigger(15)  # the job ends either way (the assertions below say what was missing)

    t = threading.Thread(target=scrape_then_stop)
    t.start()
    job.run()
    t.join()
    assert seen, "the scrape never showed every task's figures"
    assert value(seen, "tfcluster_job_state", job="fake", state="running") == 1
    for task in ("worker:0", "worker:1"):
        assert value(seen, "tfcluster_task_steps", task=task, host=plan.node(p_task(task)).host) > 0
        assert value(seen, "tfcluster_task_steps_per_second", task=task) > 0
        assert value(seen, "tfcluster_task_examples_per_second", task=task) > 0
        assert value(seen, "tfcluster_task_up", task=task) == 1
        assert value(seen, "tfcluster_task_step_part_seconds", task=task, part="collective") == pytest.approx(0.010)
        assert 0 <= value(seen, "tfcluster_task_heartbeat_age_seconds", task=task) < 5
    assert value(seen, "tfcluster_job_restarts_total", job="fake") == 0
    assert "tfcluster_job_info" in seen
    # the server is gone with the job
    with pytest.raises(OSError):
        scrape(json.loads((tmp_path / "run" / "launcher.json").read_text())["metrics_url"])


def p_task(text: str):
    from orchestrator.plan import TaskId

    return TaskId.parse(text)


@pytest.mark.e2e
def test_a_real_training_job_is_scraped_while_it_trains(keras_scraped_run):
    """keras_synthetic on 3 workers (``shared_runs.keras_scraped_run``, the run test_tensorboard reads
    too), /metrics scraped while it trains until every worker's examples/s and step time show."""
    got, err = keras_scraped_run.scraped, keras_scraped_run.launched.stderr
    assert keras_scraped_run.launched.rc == 0, err[-2000:]
    assert value(got, "tfcluster_job_state", state="running") == 1
    for i in range(3):
        host = keras_scraped_run.hosts[i]
        assert value(got, "tfcluster_task_steps", task=f"worker:{i}", host=host) > 0
        assert value(got, "tfcluster_task_memory_rss_bytes", task=f"worker:{i}") > 100e6  # a TF worker
        assert 0 < value(got, "tfcluster_task_step_part_seconds", task=f"worker:{i}", part="step") < 5
