"""A Slurm allocation with a spare node (issue 34 item 6) on the local Slurm, with real TensorFlow.

Submitted from the "login node": 2 nodes + 1 spare (sbatch --nodes=3 --no-kill). Node n2 fails like a
host losing power: its slurmd is SIGKILLed, and so are its slurmstepd and every task process of the job
step there (found from worker:1's PID up to its slurmstepd, never by name): nothing of n2 answers any
more. The launcher sees worker:1 lost (its channel closed), a host reason, so n2 is out for good; the
next attempt is a second srun step in the same Slurm job on n1 and the spare n3
(``--nodelist=n1,n3 --exclude=n2``), resumed from the backup; no new allocation, no queue wait, and it
does not wait for Slurm to mark n2 DOWN (SlurmdTimeout). The test brings n2 back afterwards.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time

import pytest
from slurm_fixtures import REPO, events, finish, launch_argv, result, start, write_spec
from slurmbed import (
    alive,
    epochs,
    free_port_base,
    job_state,
    keras_backup_job,
    show_job,
    sleep_task_on,
    steps_seen,
)
from waiting import wait_for

pytestmark = pytest.mark.e2e


def test_a_lost_node_is_replaced_by_the_spare_in_a_new_step_of_the_same_allocation(slurm, tmp_path):
    cmd = keras_backup_job(5)
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-spare",
        cmd,
        slurm={"nodes": 2, "spare_nodes": 1, "time": "5:00"},
        restart={"max_restarts": 2},
        job={"stop_grace_s": 1},
        tensorflow={"port": free_port_base(3)},
    )
    run_dir = tmp_path / "run"
    # --no-gather: the lost node's own log cannot be handed over (exit 5, as under SSH: test_elastic_e2e)
    proc = start(slurm, launch_argv(spec, run_dir, "-q", "--no-gather"), cwd=REPO)
    killed: list[int] = []
    try:
        wait_for(lambda: len(epochs(run_dir, 0, "worker-1")) >= 2, 150, "worker:1 in its second epoch")
        ready = [e for e in events(run_dir) if e["event"] == "task_ready" and e["task"] == "worker:1"]
        killed = slurm.fail_node("n2", ready[-1]["pid"])
        killed_at = time.time()
        rc, _out, err = finish(proc, timeout=240)
        n2_during = slurm.run(["sinfo", "-h", "-N", "-n", "n2", "-o", "%t"]).stdout.strip()
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm.restore_node("n2")
    assert rc == 0, err[-3000:]
    # n2 was gone for real: its slurmd and its step's slurmstepd and tasks (at least the agent and the
    # training process under them), and Slurm saw it stop responding
    assert len(killed) >= 4 and not any(alive(p) for p in killed), killed
    assert n2_during.endswith("*") or n2_during.startswith("down"), n2_during
    res = result(run_dir)
    assert res["state"] == "succeeded", res
    assert [a["state"] for a in res["attempts"]][-1] == "succeeded" and len(res["attempts"]) == 2, res["attempts"]
    first = res["attempts"][0]["root_cause"]
    assert (first["task"], first["host"], first["kind"]) == ("worker:1", "n2", "lost"), first
    # the same Slurm job (one allocation, never requeued), a second step, n2 left out of it
    state = json.loads((run_dir / "slurm.json").read_text())
    assert len(state["allocations"]) == 1 and state["requeues"] == 0, state
    job_id = state["allocations"][0]["job_id"]
    assert json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"] == job_id
    assert "--no-kill" in json.loads((run_dir / "slurm" / "sbatch.json").read_text())
    reshaped = [e for e in events(run_dir) if e["event"] == "reshaped"]
    assert [(e["host"], e["spare_in"], e["workers_before"], e["workers_after"]) for e in reshaped] == [
        ("n2", "n3", 2, 2)
    ], reshaped
    # the new step did not wait for the old one, which Slurm keeps on its books while n2 does not answer
    assert "Requested nodes are busy" not in (run_dir / "slurm" / "srun-attempt-1.log").read_text()
    # the reshape came from the lost channel, well before Slurm's SlurmdTimeout (30 s) marks n2 DOWN
    assert reshaped[0]["ts"] - killed_at < 30, reshaped[0]["ts"] - killed_at
    assert {t["host"] for t in res["tasks"].values()} == {"n1", "n3"}, res["tasks"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["reshapes"][0]["out"] == "n2" and plan["reshapes"][0]["spare_in"] == "n3", plan.get("reshapes")
    # what each task saw of its step: every one in the same Slurm job; attempt 1 a later step without n2
    seen = steps_seen(run_dir)
    assert {job for job, _, _ in seen} == {job_id}, seen
    first_step, second_step = sorted({(int(step), nodes) for _, step, nodes in seen})
    assert first_step[1] == "n[1-2]" and second_step[0] > first_step[0] and second_step[1] == "n[1,3]", seen
    # resumed from the backup, not from epoch 1
    for task in ("worker-0", "worker-1"):
        before, after = epochs(run_dir, 0, task), epochs(run_dir, 1, task)
        assert after and after[0] > 1 and after[0] <= max(before) + 1 and after[-1] == 5, (task, before, after)


def test_a_requeued_job_takes_the_nodes_to_avoid_on_this_slurm(slurm, tmp_path):
    """What ``SlurmScheduling`` asks after its own ``scontrol requeue`` when nodes were lost for good:
    Slurm 22.05 takes ``ExcNodeList`` for the requeued (pending) job."""
    from orchestrator.schedulers.slurm.versions import avoid_nodes_argv, parse_version

    version = parse_version(slurm.run(["sinfo", "--version"]).stdout)
    assert version is not None and version >= (22, 5, 0), version
    # requeued only once its script runs: Slurm says RUNNING before the batch step has started, and a
    # requeue in that moment left the script's ``sleep`` running, outside any job, on this one-machine Slurm
    started = tmp_path / "started"
    script = f"--wrap=touch {shlex.quote(str(started))}; exec sleep 60"
    job = slurm.run(["sbatch", "--parsable", "--nodes=1", "--requeue", f"--output={tmp_path}/o", script])
    job_id = job.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: "JobState=RUNNING" in show_job(slurm, job_id), 30, "the job to run")
        wait_for(started.exists, 30, "the job's script to run")
        slurm.run(["scontrol", "requeuehold", job_id])  # requeued, held so that it stays pending here
        wait_for(lambda: "JobState=PENDING" in show_job(slurm, job_id), 30, "the requeued job to be pending")
        slurm.run(avoid_nodes_argv(job_id, ["n2", "n3"]))
        assert "ExcNodeList=n2,n3" in show_job(slurm, job_id), show_job(slurm, job_id)
    finally:
        slurm.run(["scancel", job_id], check=False)


def test_without_a_spare_the_next_step_runs_on_fewer_nodes_down_to_min_workers(slurm, tmp_path):
    """No spare node, ``restart.min_workers: 2``: worker:2's agent on n3 killed; the next attempt is a
    second step of the same job on n[1-2], two workers resumed from the backup."""
    cmd = keras_backup_job(4)
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-shrink",
        cmd,
        slurm={"nodes": 3, "time": "5:00"},
        restart={"max_restarts": 2, "min_workers": 2},
        job={"stop_grace_s": 1},
        tensorflow={"port": free_port_base(3)},
    )
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir, "-q", "--no-gather"), cwd=REPO)
    try:
        wait_for(lambda: len(epochs(run_dir, 0, "worker-2")) >= 2, 150, "worker:2 in its second epoch")
        ready = [e for e in events(run_dir) if e["event"] == "task_ready" and e["task"] == "worker:2"]
        os.kill(ready[-1]["pid"], signal.SIGKILL)
        rc, _out, err = finish(proc, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert [a["state"] for a in res["attempts"]] == ["failed", "succeeded"], res["attempts"]
    reshaped = [e for e in events(run_dir) if e["event"] == "reshaped"]
    assert [(e["host"], e["spare_in"], e["workers_before"], e["workers_after"]) for e in reshaped] == [
        ("n3", None, 3, 2)
    ], reshaped
    assert {k: t["host"] for k, t in res["tasks"].items()} == {"worker:0": "n1", "worker:1": "n2"}, res["tasks"]
    state = json.loads((run_dir / "slurm.json").read_text())
    job_id = state["allocations"][0]["job_id"]
    assert len(state["allocations"]) == 1 and state["requeues"] == 0, state
    seen = steps_seen(run_dir)
    assert {job for job, _, _ in seen} == {job_id}, seen
    first_step, second_step = sorted({(int(step), nodes) for _, step, nodes in seen})
    assert first_step[1] == "n[1-3]" and second_step[0] > first_step[0] and second_step[1] == "n[1-2]", seen
    after = epochs(run_dir, 1, "worker-0")
    assert after and after[0] > 1 and after[-1] == 4, after


def test_after_slurms_own_requeue_for_a_failed_node_the_next_allocation_leaves_it_out(slurm, tmp_path):
    """Not tfcluster's requeue but Slurm's: a 2-node ``--requeue`` job on n[1-2] loses node n2 for real
    (its slurmd, slurmstepd and task killed); Slurm marks n2 down and requeues the job (NODE_FAIL).
    What the follower does when it sees the job back in the queue (``avoid``: the failed nodes of the
    allocation it lost join the pending job's ExcNodeList) keeps n2 out even once n2 answers again:
    the job runs again on n1 and n3."""
    from orchestrator.schedulers.slurm.avoid import RequeueWatch, avoid_failed

    job = slurm.run(
        ["sbatch", "--parsable", "--nodes=2", "--requeue", f"--output={tmp_path}/o", "--wrap=srun sleep 120"]
    ).stdout.strip()
    watch = RequeueWatch()
    try:
        wait_for(lambda: job_state(slurm, job) == ("RUNNING", "n[1-2]"), 30, "the job on n[1-2]")
        assert watch.see(*job_state(slurm, job)) == []
        wait_for(lambda: sleep_task_on(slurm, "n2") is not None, 30, "its step's task on n2")
        slurm.fail_node("n2", sleep_task_on(slurm, "n2"))
        wait_for(lambda: job_state(slurm, job)[0] == "PENDING", 120, "Slurm to requeue the job after n2 failed")
        lost = watch.see(*job_state(slurm, job))
        assert lost == ["n1", "n2"]
        assert avoid_failed(job, lost, env=slurm.env()) == ["n2"]
        slurm.restore_node("n2")  # n2 answers again: only the ExcNodeList keeps the job off it
        wait_for(lambda: job_state(slurm, job)[0] == "RUNNING", 60, "the requeued job to run again")
        assert job_state(slurm, job) == ("RUNNING", "n[1,3]"), show_job(slurm, job)
        assert "ExcNodeList=n2" in show_job(slurm, job)
    finally:
        slurm.run(["scancel", job], check=False)
        slurm.restore_node("n2")
