"""tfcluster on a real Slurm with real TensorFlow: a time limit (Slurm's own warning) and a preemption
requeue the job, which resumes from its backup; a requeue in the last epoch does not train again; a
custom loop saves on the stop request and resumes there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator

import pytest
from slurm_fixtures import PY, REPO, cli, events, finish, launch_argv, result, run_log, run_status, start, write_spec
from slurmbed import epochs as task_epochs
from waiting import wait_for

from orchestrator.schedulers.slurm import commands as sc
from orchestrator.supervise.figures import FIGURE_KEYS

pytestmark = pytest.mark.e2e

MWMS = ["tests/workloads/mwms_job.py"]


def _time_limit(slurm, job: str, minutes: int) -> bool:
    """Set the job's time limit (Slurm counts it in minutes from the allocation's start); False while
    Slurm refuses (a job between two allocations may be completing)."""
    return slurm.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=False).returncode == 0


def _squeue(slurm, job: str, field: str) -> str:
    return slurm.run(["squeue", "-h", "-j", job, "-o", field], check=False).stdout.strip()


EPOCHS = 30  # ≥ 40 s of training after the first epoch: Slurm's warning may take 30 s to come (below)


def test_time_limit_and_preemption_requeue_and_resume_from_the_backup(slurm, tmp_path):
    """Slurm's own time-limit warning (USR2 ``signal_lead_s`` before the limit) → save, scontrol
    requeue; then a preemption (faked with an outside `scontrol requeue`) → SIGTERM, Slurm requeues.
    Each allocation is an attempt; each resumes from BackupAndRestore at the interrupted epoch.

    The warning is Slurm's, not a faked `scancel --signal=USR2`: the supervisor calls a USR2 a time limit
    when the job has at most signal_lead_s + 60 s left, and slurmctld sends its own warning from
    signal_lead_s + 60 s before the limit on (it looks every 30 s), so a short limit for the whole job
    brings Slurm's warning into every allocation that lasts 30 s (a loaded box's TensorFlow start alone
    can). The job gets 30 minutes; once the first allocation trains, the test cuts its limit to a minute
    or two from now (Slurm warns at its next look) and gives the 30 minutes back once the run requeued."""
    cmd = [
        PY,
        "-m",
        "worker_entry.examples.keras_synthetic",
        "--backup",
        "--epochs",
        str(EPOCHS),
        "--steps-per-epoch",
        "30",
        "--slow-input-ms",
        "50",
    ]
    # TensorFlow catches SIGTERM in a multi-worker job (for PreemptionCheckpointHandler): Keras fit keeps
    # going until the grace ends, so keep it short; the backup is the last epoch's.
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-requeue",
        cmd,
        slurm={"nodes": 2, "time": "30:00", "signal_lead_s": 120},
        job={"stop_grace_s": 1},
    )
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=REPO)
    try:
        wait_for(lambda: task_epochs(run_dir, 0), 120, "an epoch of the first allocation")
        job = json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"]
        elapsed = sc.parse_duration(_squeue(slurm, job, "%M"))
        assert elapsed is not None, _squeue(slurm, job, "%M")
        # 60-120 s left: at most signal_lead_s + 30 s, so Slurm warns at its next look (within 30 s)
        assert _time_limit(slurm, job, math.ceil(elapsed / 60) + 1)
        wait_for(lambda: [e for e in events(run_dir) if e["event"] == "requeued"], 90, "Slurm's time-limit warning")
        # the supervisor read the time left before it requeued; the next allocations get the 30 minutes
        wait_for(lambda: _time_limit(slurm, job, 30) and _squeue(slurm, job, "%l") == "30:00", 30, "30 minutes back")
        wait_for(lambda: task_epochs(run_dir, 1), 120, "an epoch in the second allocation")
        slurm.run(["scontrol", "requeue", job])
        rc, _out, err = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded"
    assert [a["state"] for a in res["attempts"]] == ["requeued", "requeued", "succeeded"], res["attempts"]
    assert "time limit" in res["attempts"][0]["root_cause"]["message"]
    assert "preempted" in res["attempts"][1]["root_cause"]["message"]
    state = json.loads((run_dir / "slurm.json").read_text())
    assert (state["timeouts"], state["preemptions"], state["requeues"]) == (1, 1, 2)
    assert [a["restart"] for a in state["allocations"]] == [0, 1, 2]
    requeued = [e for e in events(run_dir) if e["event"] == "requeued"]
    assert [(e["reason"], e["how"]) for e in requeued] == [("timeout", "scontrol requeue"), ("preempted", "by Slurm")]
    for i in range(2):
        first, second, third = (task_epochs(run_dir, a, f"worker-{i}") for a in range(3))
        # resumed at the interrupted epoch, from the backup: Keras prints an epoch's line before
        # BackupAndRestore saves it, so a stop (SIGKILL after a 1 s grace) that lands between the two
        # trains that one epoch again — never an earlier one, never from the start
        assert max(first) <= second[0] <= max(first) + 1 and second[0] > 1, (first, second)
        assert max(second) <= third[0] <= max(second) + 1 and third[-1] == EPOCHS, (second, third)
    assert "requeued (scontrol requeue" in err and "resumes from the backup" in err
    # the last allocation handed the chief's checkpoint over on its connect-back channel, verified
    assert res["gather"]["errors"] == [] and res["gather"]["checkpoints"]["gathered"]
    assert json.loads((run_dir / "checkpoints" / "summary.json").read_text())["epochs"] == EPOCHS
    # every allocation's training counts: the last supervisor went on from the earlier records, and
    # status shows what report computes from heartbeats.jsonl
    st = run_status(slurm, run_dir)
    rep = json.loads(cli(slurm, REPO, "report", str(run_dir), "--json").stdout)
    for task in ("worker:0", "worker:1"):
        assert {k: st["tasks"][task][k] for k in FIGURE_KEYS} == {k: rep["workers"][task][k] for k in FIGURE_KEYS}
        assert st["tasks"][task]["steps"] >= EPOCHS * 30 and st["tasks"][task]["steps_per_s"]


@contextlib.contextmanager
def _kill_wait(slurm, seconds: int) -> Iterator[None]:
    """Slurm's KillWait (its SIGTERM -> SIGKILL delay when it ends a job: a requeue, scancel, the time
    limit) set to ``seconds`` for the block, the session's value back after (slurm.conf + reconfigure)."""
    before = slurm.conf.read_text()

    def kill_wait() -> str:
        found = re.search(r"KillWait\s*=\s*(\S+)", slurm.run(["scontrol", "show", "config"]).stdout)
        return found.group(1) if found else ""

    def write(text: str) -> None:  # whole (renamed over it): the clients read it at any moment
        tmp = slurm.conf.with_name(slurm.conf.name + ".new")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, slurm.conf)

    write(re.sub(r"^KillWait=\d+$", f"KillWait={seconds}", before, flags=re.M))
    try:
        slurm.run(["scontrol", "reconfigure"])
        wait_for(lambda: kill_wait() == str(seconds), 30, f"KillWait={seconds}")
        yield
    finally:
        write(before)
        slurm.run(["scontrol", "reconfigure"])


def test_a_requeue_in_the_last_epoch_does_not_train_again(slurm, tmp_path):
    """`scontrol requeue` of a running `requeue: true` job during its last of 5 epochs: the tasks finish that
    epoch during the stop (TensorFlow keeps training through SIGTERM) and exit 0 — BackupAndRestore then
    removes its backup. The training is complete: the run succeeds, and any next allocation finishes at
    once, saying so, instead of training again from epoch 0."""
    cmd = [
        PY,
        "-m",
        "worker_entry.examples.keras_synthetic",
        "--backup",
        "--epochs",
        "5",
        "--steps-per-epoch",
        "20",
        "--slow-input-ms",
        "40",
    ]
    spec = write_spec(tmp_path / "spec.yaml", "sl-late", cmd, slurm={"nodes": 2}, job={"stop_grace_s": 20})
    run_dir = tmp_path / "run"
    # The tasks finish the epoch, save and exit under Slurm's SIGTERM; Slurm's SIGKILL comes KillWait after it
    # (30 s by default, the test bed's 5 s): a loaded box's TensorFlow took longer than 5 s to exit, Slurm
    # killed the batch supervisor before it saw the exits 0, and the next allocation trained again.
    with _kill_wait(slurm, 30):
        proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=REPO)
        try:
            wait_for(lambda: 4 in task_epochs(run_dir, 0, "worker-0"), 150, "epoch 4 of 5 to end: the last one runs")
            job = json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"]
            slurm.run(["scontrol", "requeue", job])
            rc, _out, err = finish(proc, timeout=150)
            # Slurm requeued the job, but the run is done: launch cancelled it before returning, and said so
            assert not slurm.jobs(), slurm.jobs()
            assert f"cancelled Slurm job {job}: Slurm requeued it" in err, err[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded", res
    for i in range(2):
        epochs = [task_epochs(run_dir, a, f"worker-{i}") for a in range(len(res["attempts"]) + 1)]
        assert epochs[0] == [1, 2, 3, 4, 5], epochs  # the last epoch finished during the stop
        assert all(e == [] for e in epochs[1:]), epochs  # nothing was trained again
    kinds = [e["event"] for e in events(run_dir)]
    assert "training_completed" in kinds and "requeued" not in kinds, kinds
    assert any("Slurm requeued it" in e.get("message", "") for e in events(run_dir) if e["event"] == "warning")
    assert "completed its training" in err
    assert not (run_dir / "slurm" / "private-spec.json").exists()


def test_a_custom_loop_saves_on_the_stop_request_and_resumes_there(slurm, tmp_path):
    """The documented way for a custom loop: TensorFlow's PreemptionCheckpointHandler sees the SIGTERM
    tfcluster sends (here on `tfcluster stop`, the same as after Slurm's USR2), saves at a step both
    workers agree on, exits; the next launch resumes from that step."""
    loop = [PY, "-m", "worker_entry.examples.preemptible_loop", "--print-every", "20"]
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-loop",
        [*loop, "--steps", "1000000"],
        slurm={"nodes": 2},
        job={"stop_grace_s": 30},
        restart={"backup_dir": str(tmp_path / "backup")},
    )
    salloc = ["salloc", "--nodes=2", "--ntasks-per-node=1", "--immediate=30"]
    first = tmp_path / "run1"
    proc = start(slurm, [*salloc, *launch_argv(spec, first, "-q")], cwd=REPO)
    try:
        wait_for(lambda: "worker:1: step 100" in run_log(first), 120, "the loop to run")
        stopped = cli(slurm, REPO, "stop", str(first))
        assert "stopped: job interrupted_sigterm" in stopped.stdout, stopped
        finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = [int(m) for m in re.findall(r"worker:0: step (\d+)", run_log(first))]
    assert all(t["state"] == "stopped" for t in result(first)["tasks"].values())
    second = tmp_path / "run2"
    rc, _out, err = finish(
        start(
            slurm,
            [*salloc, *launch_argv(spec, second, "-q", "--", *loop, "--steps", str(max(printed) + 40))],
            cwd=REPO,
        ),
        timeout=120,
    )
    assert rc == 0, err[-2000:]
    resumed = int(re.search(r"worker:0: starting at step (\d+)", run_log(second)).group(1))
    assert resumed >= max(printed) > 0, (printed, resumed)  # saved on the stop request, not at step 0
    assert re.search(r"worker:1: starting at step (\d+)", run_log(second)).group(1) == str(resumed)
