"""The plan record (RUN/plan.json): one writer, one typed reader, this version and the one before it.

The version-1 files in tests/data/plan_v1/ were written by the code before the record existed
(``Plan.to_dict(record=True)`` as ``job.py`` wrote it; ``to_dict()`` as a Slurm submit wrote it);
tests/data/recorded_run/plan.json is older still (every task's TF_CONFIG and environment in full)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakenode import make_plan

from orchestrator.plan.record import PLAN_VERSION, PlanRecord, PlanRecordError
from orchestrator.runs import RunDir, read_plan, write_plan
from orchestrator.schedulers import load_plan, scheduler_of
from orchestrator.views.runs import read_run

REPO = Path(__file__).resolve().parent.parent
V1 = REPO / "tests" / "data" / "plan_v1"


def _run(tmp_path: Path, data: object) -> RunDir:
    run = RunDir(tmp_path)
    run.plan_json.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return run


@pytest.mark.parametrize(
    ("name", "scheduler", "tasks", "hosts", "cluster"),
    [
        ("ssh-record.json", "ssh", 3, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], {"worker": 3}),
        ("evaluator-record.json", "ssh", 3, ["127.0.0.2", "127.0.0.3", "127.0.0.3"], {"worker": 2}),
        ("slurm-submit.json", "slurm", 8, ["node0"] * 4 + ["node1"] * 4, {"worker": 8}),
        ("k8s-record.json", "kubernetes", 5, None, {"chief": 1, "worker": 4}),
    ],
)
def test_a_run_of_the_previous_format_is_read_into_the_same_record(tmp_path, name, scheduler, tasks, hosts, cluster):
    run = _run(tmp_path, json.loads((V1 / name).read_text()))
    plan = read_plan(run)
    assert plan is not None and plan.version == PLAN_VERSION
    assert plan.job and plan.run_id == f"fixture-{name.split('.')[0]}" and plan.scheduler == scheduler
    assert len(plan.tasks) == tasks and (hosts is None or [t.host for t in plan.tasks] == hosts)
    assert {role: len(eps) for role, eps in plan.cluster.items()} == cluster
    assert "TF_CONFIG" not in plan.common["env"] and "TFCLUSTER_TASK_INDEX" not in plan.common["env"]
    first = plan.tasks[0].task
    assert plan.tf_config(first)["cluster"] == plan.cluster  # TF_CONFIG on demand, as for a new record
    assert scheduler_of(run).name == scheduler
    if scheduler == "slurm":
        assert plan.extras is not None and plan.extras["ntasks"] == 8  # the scheduler's own part
    if name == "evaluator-record.json":
        assert plan.roles and plan.strategy == "multi_worker_mirrored"


def test_the_oldest_recorded_run_is_read_too(tmp_path):
    run = RunDir(REPO / "tests" / "data" / "recorded_run")
    plan = read_plan(run)
    assert plan is not None and plan.job == "agree" and len(plan.tasks) == 3
    assert plan.hosts() == {"worker:0": "10.248.107.2", "worker:1": "10.248.107.3", "worker:2": "10.248.107.4"}
    assert plan.cluster == {"worker": ["10.248.107.2:23456", "10.248.107.3:23456", "10.248.107.4:23456"]}
    assert plan.policy.window_s == 2.0  # no policy recorded then: the nodes' step-clock window


def test_the_one_writer_and_the_reader_agree(tmp_path):
    _, plan = make_plan(3, heartbeat={"straggler_ratio": 2.5}, tensorflow={"chief": True})
    written = write_plan(RunDir(tmp_path), plan)
    read = read_plan(RunDir(tmp_path))
    assert read == written
    assert read.hosts() == {"chief:0": "10.0.0.1", "worker:0": "10.0.0.2", "worker:1": "10.0.0.3"}
    assert read.policy.ratio == 2.5 and read.tasks[1].ssh == "me@10.0.0.2:22"
    assert read.tf_config("worker:1") == plan.nodes[2].tf_config  # what the node builds
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o600


def test_plan_json_is_the_record_of_plan_json_output(capsys):
    """`tfcluster plan --json` prints exactly what a launch records."""
    from orchestrator.cli.main import main

    spec = str(REPO / "cluster_specs" / "ps-slurm.yaml")
    assert main(["plan", spec, "--json", "--run-id", "r1"]) == 0
    printed = capsys.readouterr().out
    _, plan = load_plan(spec, "r1")
    assert printed == PlanRecord.from_plan(plan).to_json()
    assert PlanRecord.from_dict(json.loads(printed)) == PlanRecord.from_plan(plan)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not JSON"),
        ([1, 2], "not a plan record (expected a JSON object)"),
        ({"version": 4, "job": "j", "run_id": "r", "tasks": []}, "version 4 was written by a newer tfcluster"),
        ({"version": "2", "job": "j"}, "version: expected 1 to 3"),
        ({"version": 2, "job": 5, "run_id": "r"}, "job: expected a string"),
        ({"version": 2, "job": "j", "run_id": "r", "tasks": {"a": 1}}, "tasks: expected a list"),
        ({"version": 2, "job": "j", "run_id": "r", "tasks": [{"task": "boss:1"}]}, "tasks[0].task: expected a task"),
        ({"job": "j", "run_id": "r", "nodes": [{"task": "worker:0"}]}, "nodes[0].task: expected an object"),
    ],
)
def test_a_damaged_or_newer_plan_json_is_refused_naming_the_file_and_field(tmp_path, data, message):
    run = _run(tmp_path, data)
    with pytest.raises(PlanRecordError) as err:
        read_plan(run)
    assert str(err.value).startswith(f"{run.plan_json}: ") and message in str(err.value)
    row = read_run(run, lambda r: scheduler_of(r).handle(r), now=0)  # the list of runs says so, no traceback
    assert row.state == "damaged" and "plan.json" in (row.root_cause or "")
    assert scheduler_of(run).name == "ssh"  # a damaged record is the default scheduler's to show


def test_no_plan_json_is_no_record(tmp_path):
    assert read_plan(RunDir(tmp_path)) is None
