"""Slurm without a Slurm: requeue caps and resubmission, the spec's private trip to the batch job, and a
requeue after the training completed."""

from __future__ import annotations

import json
import signal

import pytest
from slurm_specs import slurm_job, spec_text

from orchestrator.core.states import JobState
from orchestrator.schedulers import plan_spec
from orchestrator.schedulers.slurm import commands as sc
from orchestrator.schedulers.slurm.commands import JobInfo
from orchestrator.schedulers.slurm.state import SlurmState
from orchestrator.spec import load_spec_text

# ----------------------------------------------------------------------------- requeue caps and resubmission


def _job(tmp_path, monkeypatch, *, requeue=True, state=None):
    loaded = load_spec_text(spec_text(f"requeue: {str(requeue).lower()}\nmax_requeues: 2\n"))
    state = state or SlurmState(run_id="sl-1", job_ids=["9"])
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: JobInfo("9", "RUNNING", time_left="1:00"))
    job, run, _ = slurm_job(tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9"})
    run.slurm_dir.mkdir()
    state.allocations.append({"job_id": "9", "restart": 0, "started_ts": 1.0})  # this allocation (open())
    job.interrupt.trigger(signal.SIGUSR2)
    return job, run


def _end_allocation(job):
    """The attempt the USR2 interrupted, concluded by the job's policy; then the job's one end."""
    from orchestrator.core.result import AttemptResult

    job.result.become(JobState.STARTING)  # the attempt ran
    decision = job.conclude(AttemptResult(0, JobState.INTERRUPTED_SIGTERM, 1.0, 2.0, {}))
    return job.end(decision)


def test_past_the_cap_a_time_out_ends_the_run(tmp_path, monkeypatch):
    job, run = _job(tmp_path, monkeypatch, state=SlurmState(run_id="sl-1", job_ids=["9"], timeouts=2))
    requeued = []
    monkeypatch.setattr(sc, "requeue", requeued.append)
    res = _end_allocation(job)
    assert requeued == [] and res.state == JobState.FAILED
    assert "3 time-outs, more than slurm.max_requeues (2)" in res.root_cause.message
    assert json.loads(run.result_json.read_text())["state"] == "failed"


def test_where_requeue_is_refused_the_job_is_resubmitted_after_this_one(tmp_path, monkeypatch):
    job, run = _job(tmp_path, monkeypatch)
    (run.path / "slurm" / "sbatch.json").write_text(json.dumps(["sbatch", "--parsable", "--job-name=sl", "/r/job.sh"]))

    def refuse(job_id):
        raise sc.SlurmError("scontrol failed (exit 1): Requested operation is presently disabled")

    submitted = []
    monkeypatch.setattr(sc, "requeue", refuse)
    monkeypatch.setattr(sc, "submit", lambda argv, env=None: submitted.append(argv) or "10")
    res = _end_allocation(job)
    assert res.state == JobState.REQUEUED and not run.result_json.exists()
    assert submitted == [["sbatch", "--parsable", "--job-name=sl", "--dependency=afterany:9", "/r/job.sh"]]
    state = SlurmState.load(run)
    assert state.job_ids == ["9", "10"] and (state.timeouts, state.preemptions, state.requeues) == (1, 0, 1)
    kinds = [json.loads(line)["event"] for line in run.events_jsonl.read_text().splitlines()]
    assert "requeued" in kinds
    assert json.loads((run.path / "status.json").read_text())["state"] == "requeued"


def test_with_requeue_off_the_time_limit_ends_the_run(tmp_path, monkeypatch):
    job, _ = _job(tmp_path, monkeypatch, requeue=False)
    res = _end_allocation(job)
    assert res.state == JobState.FAILED and "slurm.requeue is false" in res.root_cause.message


def test_an_allocation_whose_supervisor_died_is_an_attempt_of_its_own(tmp_path, monkeypatch):
    """SIGKILLed with its allocation (a node failure, a requeue past KillWait): the next supervisor
    records that allocation as a requeued attempt, counts a preemption, and continues the numbering."""
    loaded = load_spec_text(spec_text())
    earlier = {
        "attempt": 0,
        "state": "requeued",
        "started_ts": 1.0,
        "ended_ts": 2.0,
        "tasks": {},
        "failures": [{"kind": "scheduler", "message": "time limit", "ts": 2.0}],
    }
    state = SlurmState(
        run_id="sl-1",
        job_ids=["9"],
        timeouts=1,
        attempts=[earlier],
        allocations=[
            {"job_id": "9", "restart": 0, "started_ts": 1.0, "ended_ts": 2.0, "end": "timeout"},
            {"job_id": "9", "restart": 1, "started_ts": 3.0},
        ],
    )
    job, _, scheduling = slurm_job(
        tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "2"}
    )
    assert scheduling.open(job)  # it continues a run
    assert [a.state for a in job.result.attempts] == [JobState.REQUEUED, JobState.REQUEUED]
    assert "ended without its supervisor recording it" in job.result.attempts[1].root_cause.message
    assert all(t.state.value == "lost" for t in job.result.attempts[1].tasks.values())
    assert (len(job.result.attempts), state.preemptions, state.timeouts) == (2, 1, 1)
    assert job.result.started_ts == 1.0  # the run's wall time counts from its first allocation
    job.bus.close()


def _submitted(tmp_path, monkeypatch, extra: str = "  env: {API_TOKEN: s3cr3t-value}\n", command=None):
    """submit() with sbatch replaced by a recorder: the run directory and what sbatch was given."""
    from orchestrator.schedulers.slurm import submit as sub

    calls = []
    monkeypatch.setattr(sub.sc, "have", lambda name: True)
    monkeypatch.setattr(sub.sc, "submit", lambda argv, env=None: calls.append((list(argv), env)) or "77")
    loaded = load_spec_text(spec_text(extra=extra), "/home/me/spec.yaml")
    plan = plan_spec(loaded, "sl-1")
    done = sub.submit(loaded, plan, str(tmp_path / "run"), command)
    return done.rundir, calls


def test_the_spec_travels_to_the_batch_job_in_a_private_file_not_in_its_environment(tmp_path, monkeypatch):
    """Slurm stores a job's environment (slurmctld's state, `sacct --env-vars`): the credentials go in
    RUN/slurm/private-spec.json (0600) instead, which the batch job reads, and the run's end removes."""
    from orchestrator.schedulers.slurm.private_spec import read_private_spec

    rundir, calls = _submitted(tmp_path, monkeypatch, command=["python", "other.py", "--fast"])
    ((argv, env),) = calls
    assert env is None or not any("s3cr3t-value" in v for v in env.values())
    assert not any("s3cr3t-value" in a for a in argv)
    private = rundir.slurm_private_spec
    assert private.stat().st_mode & 0o077 == 0 and "s3cr3t-value" in private.read_text()
    assert "s3cr3t-value" not in rundir.spec_yaml.read_text()
    back = read_private_spec(rundir)
    assert back.spec.job.command == ["python", "other.py", "--fast"] and back.path == "/home/me/spec.yaml"
    assert back.spec.job.env["API_TOKEN"] == "s3cr3t-value"


def test_without_its_private_spec_the_batch_job_refuses_to_run(tmp_path, monkeypatch):
    """Never the redacted copy: it would run with `<redacted>` as the credentials."""
    from orchestrator.schedulers.slurm import batch

    rundir, _ = _submitted(tmp_path, monkeypatch)
    rundir.slurm_private_spec.unlink()
    started = []
    monkeypatch.setattr(batch, "Job", lambda *a, **k: started.append(a))
    result = batch.run_batch(str(rundir.path), env={"SLURM_JOB_ID": "77"})
    assert started == [] and result.state == JobState.START_FAILED
    stored = json.loads(rundir.result_json.read_text())
    assert stored["state"] == "start_failed" and "private-spec.json is missing" in stored["root_cause"]["message"]


@pytest.mark.parametrize("damage", ["garbled", "group-writable", "foreign"])
def test_a_private_spec_another_user_could_have_written_is_refused(tmp_path, monkeypatch, damage):
    import os

    from orchestrator.schedulers.slurm.private_spec import PrivateSpecMissing, read_private_spec

    if damage == "foreign" and os.geteuid() != 0:
        pytest.skip("needs root: a file owned by another user")
    rundir, _ = _submitted(tmp_path, monkeypatch)
    path = rundir.slurm_private_spec
    if damage == "garbled":
        path.write_text("[1, 2]")
    elif damage == "group-writable":
        path.chmod(0o620)
    else:
        os.chown(path, 65534, 65534)
    with pytest.raises(PrivateSpecMissing, match=r"damaged|not a private file"):
        read_private_spec(rundir)


# ----------------------------------------------------------------------------- a requeue after the training completed


def _attempt(states, state=JobState.INTERRUPTED_SIGTERM, failures=()):
    from orchestrator.core.result import AttemptResult, TaskResult
    from orchestrator.core.states import TaskState

    tasks = {
        f"worker:{i}": TaskResult(f"worker:{i}", f"n{i + 1}", TaskState(s), exit_code=0 if s == "succeeded" else None)
        for i, s in enumerate(states)
    }
    return AttemptResult(0, state, 1.0, 2.0, tasks, list(failures))


@pytest.mark.parametrize(
    ("states", "expect"),
    [
        (["succeeded", "succeeded"], "completed"),
        (["succeeded", "stopped"], "requeue"),
        (["stopped", "stopped"], "requeue"),
    ],
)
def test_tasks_that_exit_0_during_a_preemption_completed_their_training(tmp_path, monkeypatch, states, expect):
    """SIGTERM from Slurm (a requeue) while every task finished its last epoch and exited 0: the run is
    done (a requeue would train again from epoch 0: BackupAndRestore removed its backup)."""
    from orchestrator.job import Action

    loaded = load_spec_text(spec_text())
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: JobInfo("9", "COMPLETING"))
    job, _, scheduling = slurm_job(tmp_path, loaded, SlurmState(run_id="sl-1"), batch=True, env={"SLURM_JOB_ID": "9"})
    job.interrupt.trigger(signal.SIGTERM)
    decision = scheduling.policy(loaded.spec).decide(_attempt(states), [], job.interrupt)
    if expect == "completed":
        assert decision.action is Action.FINISH and decision.ended_by is None
        assert "completed its training" in decision.completed and "not requeued" in decision.completed
        res = _attempt(states)
        job.policy = scheduling.policy(loaded.spec)
        job.result.become(JobState.STARTING)  # the attempt ran
        job.conclude(res)
        assert res.state == JobState.SUCCEEDED and job.result.state == JobState.SUCCEEDED
    else:
        assert decision.action is Action.REQUEUE and decision.completed is None
    job.bus.close()


@pytest.mark.parametrize(
    ("earlier", "status", "expect"),
    [
        ("recorded", None, True),  # the last allocation recorded a requeue although every task had exited 0
        ("lost", ["succeeded"] * 4, True),  # its supervisor died unrecorded; its last status says it all
        ("lost", ["succeeded"] * 3 + ["running"], False),
        ("lost", None, False),
    ],
)
def test_a_requeued_allocation_whose_tasks_all_completed_finishes_at_once(tmp_path, earlier, status, expect):
    """The next allocation reads the earlier attempts (slurm.json; for a supervisor that died unrecorded,
    its last status.json): every task completed → nothing to run, the run succeeds, saying so."""
    loaded = load_spec_text(spec_text())
    state = SlurmState(run_id="sl-1", job_ids=["9"], allocations=[{"job_id": "9", "restart": 0, "started_ts": 1.0}])
    if earlier == "recorded":
        rec = _attempt(["succeeded"] * 4, JobState.REQUEUED, [])
        state.attempts = [rec.to_dict()]
        state.allocations[0].update(ended_ts=2.0, end="preempted")
    job, run, scheduling = slurm_job(
        tmp_path, loaded, state, batch=True, env={"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"}
    )
    if status is not None:
        tasks = {f"worker:{i}": {"state": st} for i, st in enumerate(status)}
        run.status_json.write_text(json.dumps({"attempt": 0, "tasks": tasks}))
    scheduling.open(job)
    said = scheduling.completed_earlier(job)
    assert (said is not None) == expect, said
    if expect:
        assert "nothing is left to run" in said
    job.bus.close()
