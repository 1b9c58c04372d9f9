"""Real jobs that tests of several files assert on, each launched once per session.

A real 3-worker MWMS job costs ~20 s on 2 cores before its first step (three TensorFlow imports and
the strategy's start-up), whatever it trains after: where tests of different files launch the same
job and assert different things on it, they share one run here. Each fixture starts a test bed of
its own, runs the job to its end (waiting for the very conditions its tests assert), stops the bed
(failing on anything left on a host) and returns the finished run; nothing of it keeps running.
The run directory stays (pytest's session temp), so a test may run `status`/`report` on it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import (
    PY,
    Launched,
    assert_no_job_processes,
    backed_up_epochs,
    repo_python,
    run_launch,
    start_launch,
    training_pid,
)
from testbed_fixtures import _Factory
from waiting import wait_for

#: the homogeneous custom loop (`custom_loop_run`): optimizer steps, examples per worker and step
CUSTOM_LOOP_STEPS = 400
CUSTOM_LOOP_BATCH = 96

#: keras_synthetic (`keras_scraped_run`): 4 epochs of this many steps
KERAS_EPOCHS = 4
KERAS_STEPS_PER_EPOCH = 100


@pytest.fixture(scope="session")
def custom_loop_run(tmp_path_factory) -> Iterator[Launched]:
    """``worker_entry.examples.custom_loop`` on 3 homogeneous workers of the namespace bed (the tests
    using it carry ``requires_netns``): ``CUSTOM_LOOP_STEPS`` steps of ``CUSTOM_LOOP_BATCH`` examples per
    worker, heartbeats every 1 s, a step-clock window every 2 s, run to its end without a gather.
    test_custom_loop_e2e asserts its steps, examples and split; test_status_report that `status` and
    `report` agree on it."""
    tmp = tmp_path_factory.mktemp("custom-loop-run")
    beds = _Factory()
    try:
        tb = beds(3, mode="netns")
        args = ["--steps", str(CUSTOM_LOOP_STEPS), "--accum", "1", "--batch-size", str(CUSTOM_LOOP_BATCH)]
        spec = tb.write_spec(
            tmp / "spec.yaml",
            "homog1",
            [PY, "-m", "worker_entry.examples.custom_loop", *args],
            job={"python": repo_python(tmp)},
            heartbeat={"interval_s": 1.0, "timeout_s": 10, "profile_interval_s": 2},
        )
        run = run_launch(tb, spec, tmp / "run", "-q", "--no-gather")
        assert_no_job_processes(tb, 10)
    finally:
        beds.finish()
    yield run


@dataclass(frozen=True)
class ScrapedRun:
    """A finished ``keras_scraped_run``: the launch, the live /metrics scrape that showed every
    worker's training figures, the metric names seen on /metrics from then on, and the directory the
    user's own TensorBoard runs are in."""

    launched: Launched
    scraped: dict[str, list]
    hosts: tuple[str, ...]
    tensorboard: Path  # --tensorboard DIR (its "train" run is the user's)
    families: frozenset[str]  # every metric family of every later scrape (declared, sampled or not)
    samples: frozenset[str]  # every sample name with a sample in one of those scrapes


@pytest.fixture(scope="session")
def keras_scraped_run(tmp_path_factory) -> Iterator[ScrapedRun]:
    """``keras_synthetic`` on 3 workers of the loopback bed, ``KERAS_EPOCHS`` x ``KERAS_STEPS_PER_EPOCH``
    steps, heartbeats every 0.5 s and a step-clock window every 1 s, with /metrics (``--metrics-port 0``)
    and TensorBoard scalars beside the user's own runs (``--tensorboard DIR``), no gather. Scraped live
    until every worker's examples/s and step time show, then again until every metric the Grafana dashboard
    queries has had a sample (or the run ended), then run to its end. test_metrics asserts on the live
    scrape, test_grafana on the names seen, test_tensorboard on the scalars and the goodput."""
    from test_grafana import dashboard_missing, scrape_names
    from test_metrics import scrape, value

    tmp = tmp_path_factory.mktemp("keras-scraped-run")
    own = tmp / "logs"
    (own / "train").mkdir(parents=True)  # the user's own runs (a Keras TensorBoard callback's) stay as they are
    beds = _Factory()
    try:
        tb = beds(3)
        cmd = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", str(KERAS_EPOCHS)]
        cmd += ["--steps-per-epoch", str(KERAS_STEPS_PER_EPOCH)]
        spec = tb.write_spec(
            tmp / "spec.yaml",
            "scraped",
            cmd,
            job={"python": repo_python(tmp)},
            heartbeat={"interval_s": 0.5, "timeout_s": 20, "profile_interval_s": 1},
        )
        run_dir = tmp / "run"
        t0 = time.monotonic()
        proc = start_launch(tb, spec, run_dir, "-q", "--no-gather", "--metrics-port", "0", "--tensorboard", str(own))
        try:
            url = wait_for(
                lambda: (
                    (run_dir / "launcher.json").exists()
                    and json.loads((run_dir / "launcher.json").read_text()).get("metrics_url")
                ),
                60,
                "the metrics URL",
            )

            def training() -> dict[str, list] | None:
                got = scrape(url)
                ok = all(
                    (value(got, "tfcluster_task_examples_per_second", task=f"worker:{i}") or 0) > 0
                    and value(got, "tfcluster_task_step_part_seconds", task=f"worker:{i}", part="step")
                    for i in range(3)
                )
                return got if ok else None

            got = wait_for(training, 120, "training metrics of every worker", interval=0.5)
            families: set[str] = set()
            samples: set[str] = set()

            def dashboard_sampled_or_ended() -> bool:
                """Every metric the dashboard queries seen with a sample, or the launcher gone (its
                /metrics with it: test_grafana then names what never showed)."""
                try:
                    fams, samps = scrape_names(url)
                except (OSError, http.client.HTTPException):  # the launcher ending, its server with it
                    return proc.poll() is not None
                families.update(fams)
                samples.update(samps)
                return not dashboard_missing(samples) or proc.poll() is not None

            wait_for(dashboard_sampled_or_ended, 120, "a sample of every dashboard metric", interval=0.5)
            out, err = proc.communicate(timeout=180)
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert_no_job_processes(tb, 10)
        hosts = tuple(h.address for h in tb.hosts)
    finally:
        beds.finish()
    launched = Launched(proc.returncode, out, err, run_dir, seconds)
    yield ScrapedRun(launched, got, hosts, own, frozenset(families), frozenset(samples))


@pytest.fixture(scope="session")
def restarted_run(tmp_path_factory) -> Iterator[Launched]:
    """``keras_synthetic --backup`` on 3 workers of the loopback bed, 6 epochs of 60 steps, heartbeats every
    0.5 s and a step-clock window every 1 s, ``restart.max_restarts: 1`` with a backup directory the hosts
    share: once the chief's backup holds epoch 2, worker:1's training process is SIGKILLed; the job restarts
    every task, resumes from the backup and runs to its end (the chief's checkpoints gathered).
    test_restart_e2e asserts the restart and the resume, test_goodput_views the goodput of the two attempts."""
    tmp = tmp_path_factory.mktemp("restarted-run")
    backup = tmp / "backup"  # the hosts share this file system: the fixture reads the chief's backup
    beds = _Factory()
    try:
        tb = beds(3)
        command = [PY, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "6", "--steps-per-epoch", "60"]
        spec = tb.write_spec(
            tmp / "spec.yaml",
            "resume",
            [*command, "--backup"],
            job={"python": repo_python(tmp)},
            restart={"max_restarts": 1, "backup_dir": str(backup)},
            heartbeat={"interval_s": 0.5, "profile_interval_s": 1},
        )
        run_dir = tmp / "run"
        t0 = time.monotonic()
        proc = start_launch(tb, spec, run_dir, "-q")
        try:
            # Let two epochs complete with their backups written, then kill worker:1 during the third. Keras
            # prints an epoch's line before BackupAndRestore saves it: wait for the save itself (the chief's
            # checkpoint state names the epoch's checkpoint once its files are written), not a guessed pause.
            wait_for(lambda: backed_up_epochs(backup) >= 2, 240, "the backup of epoch 2 written")
            os.kill(wait_for(lambda: training_pid(tb, tb.hosts[1]), 60, "training pid"), signal.SIGKILL)
            out, err = proc.communicate(timeout=300)
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert_no_job_processes(tb, 5)
    finally:
        beds.finish()
    yield Launched(proc.returncode, out, err, run_dir, seconds)
