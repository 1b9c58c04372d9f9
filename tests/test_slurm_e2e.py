"""tfcluster on a real Slurm (slurmctld + three slurmd on this machine) with real TensorFlow.

From the "login node" (this shell, no SLURM_JOB_ID): `launch` submits a batch job whose supervisor
runs in the allocation and follows it; inside an allocation (salloc): `launch` runs one srun step.
Faults: a task SIGKILLed, `stop`, a pending job cancelled, sbatch refusing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_fixtures import PY, cli, env_for, events, finish, launch_argv, result, start, tasks_saying, write_spec
from slurmbed import epochs as task_epochs
from waiting import wait_for

from orchestrator.schedulers.slurm import commands as sc
from orchestrator.supervise.figures import FIGURE_KEYS

pytestmark = pytest.mark.e2e

MWMS = ["tests/workloads/mwms_job.py"]


def mwms(*args: str, hold: Path | None = None) -> list[str]:
    """The MWMS workload, after printing the TF_CONFIG the task built (`TF_CONFIG {...}`). With ``hold``
    each task, its training done, waits for that file before it exits with the workload's status: the
    test looks at the running job for as long as it needs, whatever the training's speed, and then
    prints ``RELEASED``: a line every task prints within ~0.1 s of the others (they wait for one file)."""
    show = 'echo "TF_CONFIG $TF_CONFIG"; echo "SECRET ${TFCLUSTER_SECRET:-none}"; echo "TOKENLEN ${#API_TOKEN}"'
    if hold is None:
        return ["sh", "-c", show + '; exec "$0" "$@"', PY, *MWMS, *args]
    wait = f"; rc=$?; until [ -e {shlex.quote(str(hold))} ]; do sleep 0.1; done; echo RELEASED; exit $rc"
    return ["sh", "-c", show + '; "$0" "$@"' + wait, PY, *MWMS, *args]


def test_mwms_submitted_from_the_login_node(slurm, tmp_path):
    token = "tok-" + os.urandom(6).hex()  # a credential in job.env: the job gets it, the run directory does not
    checked = tmp_path / "checked"  # the tasks end once the test has looked at the running job
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-login",
        mwms("--epochs", "2", "--steps", "10", hold=checked),
        job={"env": {"API_TOKEN": token}},
    )
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir), cwd=_repo())
    try:
        wait_for(lambda: "strategy ready" in _log(run_dir), 120, "the tasks to run")
        # Slurm keeps the job's environment and script (slurmctld's state, slurmd's spool): not the credential
        forms = _encodings(token)
        in_slurm = [p for p in slurm.dir.rglob("*") if p.is_file() and any(f in _bytes(p) for f in forms)]
        private = run_dir / "slurm" / "private-spec.json"
        private_while_running = (
            (private.stat().st_mode & 0o777, token in private.read_text()) if private.exists() else None
        )
    finally:
        checked.touch()
        rc, out, err = finish(proc, timeout=150)
    assert in_slurm == [], in_slurm
    assert private_while_running == (0o600, True)
    assert rc == 0, err[-3000:]
    assert not private.exists()  # the run is over: its credentials are not kept
    res = result(run_dir)
    assert res["state"] == "succeeded" and res["gather"]["errors"] == []
    hosts = {t: v["host"] for t, v in res["tasks"].items()}
    assert hosts == {"worker:0": "n1", "worker:1": "n2", "worker:2": "n3"}
    # the connect-back secret never reaches the training command; the spec's credential reached every task
    # (via the job's env): each task said so once, on a line of its own or collapsed with the others'
    every = [f"worker:{i}" for i in range(3)]
    assert tasks_saying(out, "SECRET none") == tasks_saying(out, f"TOKENLEN {len(token)}") == every, out
    # what every task printed at the same moment is one console line on the login node (issue 32.10);
    # each task's log keeps its own copy, combined.log all three
    assert [ln for ln in out.splitlines() if ln.endswith("RELEASED")] == ["[worker:0-2] RELEASED"], out
    for i in range(3):
        assert (run_dir / "logs" / f"worker-{i}.log").read_text().count("RELEASED") == 1
    assert (run_dir / "combined.log").read_text().count("] RELEASED\n") == 3
    stored = [p for p in run_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert stored == [], stored
    for i in range(3):
        assert f"worker:{i}: done" in out  # live, prefixed, on the login node's stdout
        assert f"[worker:{i} n{i + 1}] worker:{i}: strategy ready with 3 replicas" in out
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds[0] == "job_started" and "slurm_allocation" in kinds and kinds[-1] == "job_finished"
    st = cli(slurm, _repo(), "status", str(run_dir), "--json")
    status = json.loads(st.stdout)
    assert status["state"] == "succeeded" and status["slurm"]["state"] == "COMPLETED"
    assert status["slurm"]["job_ids"] == [json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"]]
    assert cli(slurm, _repo(), "report", str(run_dir)).returncode == 0
    logs = cli(slurm, _repo(), "logs", str(run_dir), "--task", "worker:2", "--raw").stdout
    assert "worker:2: done" in logs and "worker:0:" not in logs
    assert oct(os.stat(run_dir).st_mode & 0o777) == "0o700"
    for name in ("slurm/job.sh", "slurm/sbatch.json", "slurm.json", "spec.yaml"):
        assert os.stat(run_dir / name).st_mode & 0o077 == 0, name
    assert "TFCLUSTER_SECRET" not in (run_dir / "slurm" / "job.sh").read_text()


def _bytes(path: Path) -> bytes:
    """A file's bytes; none if it went away since it was listed (slurmctld replaces its state files)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _encodings(secret: str) -> list[bytes]:
    """``secret`` as bytes, and as it shows inside base64 at each of the three alignments."""
    import base64

    forms = [secret.encode()]
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + secret.encode())
        forms.append(enc[(k * 4 + 2) // 3 + 1 : -4])
    return forms


def test_mwms_inside_an_allocation_with_tasks_sharing_a_node(slurm, tmp_path):
    """salloc: `launch` sees SLURM_JOB_ID and runs one srun step; 3 tasks on one node, a chief."""
    spec = write_spec(
        tmp_path / "spec.yaml",
        "sl-alloc",
        mwms("--epochs", "2", "--steps", "10"),
        slurm={"nodes": 1, "tasks_per_node": 3},
        tensorflow={"chief": True},
    )
    run_dir = tmp_path / "run"
    argv = ["salloc", "--nodes=1", "--ntasks-per-node=3", "--immediate=30", *launch_argv(spec, run_dir)]
    rc, out, err = finish(start(slurm, argv, cwd=_repo()), timeout=150)
    assert rc == 0, err[-3000:]
    res = result(run_dir)
    assert res["state"] == "succeeded"
    assert set(res["tasks"]) == {"chief:0", "worker:0", "worker:1"}
    assert {v["host"] for v in res["tasks"].values()} == {"n1"}
    assert "chief:0: done" in out
    # the three TF servers shared one address and got three ports
    configs = _tf_configs(run_dir)
    assert len(configs) == 3
    eps = configs[0]["cluster"]["chief"] + configs[0]["cluster"]["worker"]
    assert len(set(eps)) == 3 and all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert (run_dir / "slurm.json").exists() and json.loads((run_dir / "slurm.json").read_text())[
        "mode"
    ] == "allocation"


def _tf_configs(run_dir):
    """TF_CONFIG as each task saw it (printed by the command before the workload starts)."""
    text = (run_dir / "combined.log").read_text()
    return [json.loads(line.split("] TF_CONFIG ", 1)[1]) for line in text.splitlines() if "] TF_CONFIG " in line]


def _log(run_dir) -> str:
    try:
        return (run_dir / "combined.log").read_text()
    except OSError:
        return ""


def _repo():
    from slurm_fixtures import REPO

    return REPO


@pytest.mark.parametrize("victim", ["training", "worker_entry"])
def test_sigkill_of_one_task_takes_the_whole_step_down(slurm, tmp_path, victim):
    """SIGKILL of worker:1's training process (worker_entry reports it) or of the Slurm task itself
    (worker_entry: its channel closes, --kill-on-bad-exit ends the step): every task gone, root cause."""
    pids = tmp_path / "pids"
    pids.mkdir()
    cmd = mwms("--epochs", "50", "--steps", "20", "--step-sleep", "0.02", "--pid-dir", str(pids))
    spec = write_spec(tmp_path / "spec.yaml", "sl-kill", cmd)
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=_repo())
    try:
        wait_for(lambda: "worker:2: epoch 1 begins" in _log(run_dir), 120, "training to run")
        if victim == "training":
            pid = int((pids / "worker-1.pid").read_text())
        else:
            pid = next(e["pid"] for e in events(run_dir) if e["event"] == "task_ready" and e["task"] == "worker:1")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        rc, _out, err = finish(proc, timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 3, err[-3000:]
    res = result(run_dir)
    rc_ = res["root_cause"]
    assert (rc_["task"], rc_["host"]) == ("worker:1", "n2"), rc_
    if victim == "training":
        assert rc_["kind"] == "signal" and rc_["signal"] == "SIGKILL"
    else:
        assert rc_["kind"] == "lost"
    assert "root cause: worker:1 on n2" in err
    assert all(t["state"] in ("stopped", "failed", "lost") for t in res["tasks"].values()), res["tasks"]
    ended = [e["ts"] for e in events(run_dir) if e["event"] in ("task_exited", "task_lost")]
    assert len(ended) >= 3 and max(ended) - killed_at < 15  # every task ended within seconds of the fault
    # nothing is left of the step: the `slurm` fixture fails the test on any process of a job
    wait_for(lambda: not slurm.processes(), 15, "every task process to be gone")


def test_stop_asks_the_supervisor_then_scancel_and_leaves_a_clean_run(slurm, tmp_path):
    spec = write_spec(
        tmp_path / "spec.yaml", "sl-stop", mwms("--epochs", "200", "--steps", "20", "--step-sleep", "0.02")
    )
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=_repo())
    try:
        wait_for(lambda: "worker:0: epoch 1 begins" in _log(run_dir), 120, "training to run")
        st = json.loads(cli(slurm, _repo(), "status", str(run_dir), "--json").stdout)
        assert st["state"] == "running" and st["slurm"]["state"] == "RUNNING" and st["slurm"]["nodes"] == "n[1-3]"
        assert {t["host"] for t in st["tasks"].values()} == {"n1", "n2", "n3"}
        stopped = cli(slurm, _repo(), "stop", str(run_dir))
        assert stopped.returncode == 0 and "stopped: job interrupted_sigterm" in stopped.stdout, stopped
        rc, _out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 143, err[-2000:]  # the follower ends with the run's state (stop = SIGTERM)
    res = result(run_dir)
    assert res["state"] == "interrupted_sigterm"
    assert all(t["state"] == "stopped" for t in res["tasks"].values()), res["tasks"]
    assert "scancel of the whole job was needed" not in stopped.stdout  # the supervisor's own teardown sufficed
    assert not slurm.jobs()
    assert json.loads((run_dir / "status.json").read_text())["finished"] is True


def test_ctrl_c_on_the_follower_cancels_a_pending_job(slurm, tmp_path):
    """Non-interactive Ctrl-C: cancel. The job never started: the follower writes the result itself."""
    spec = write_spec(tmp_path / "spec.yaml", "sl-pending", ["true"], slurm={"extra_args": ["--begin=now+1hour"]})
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir), cwd=_repo())
    try:
        wait_for(lambda: "PENDING" in json.dumps(_status(slurm, run_dir)), 30, "the job to pend")
        assert _status(slurm, run_dir)["state"] == "pending"
        proc.send_signal(signal.SIGINT)
        rc, _out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, err
    assert "cancelled Slurm job" in err
    res = result(run_dir)
    assert res["state"] == "interrupted_sigint" and res["root_cause"]["kind"] == "scheduler"
    assert not slurm.jobs()


def test_sbatch_refusing_the_job_is_a_start_failure_with_slurms_words(slurm, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", "sl-refused", ["true"], slurm={"partition": "nosuchpartition"})
    run_dir = tmp_path / "run"
    rc, _out, err = finish(start(slurm, launch_argv(spec, run_dir), cwd=_repo()), timeout=60)
    assert rc == 4, err
    res = result(run_dir)
    assert res["state"] == "start_failed"
    assert res["root_cause"]["kind"] == "scheduler" and "invalid partition" in res["root_cause"]["message"].lower()
    assert "sbatch refused the job" in err


def _status(slurm, run_dir) -> dict:
    done = cli(slurm, _repo(), "status", str(run_dir), "--json")
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}


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
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=_repo())
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
    st = _status(slurm, run_dir)
    rep = json.loads(cli(slurm, _repo(), "report", str(run_dir), "--json").stdout)
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
        proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=_repo())
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


def test_ctrl_c_on_a_terminal_can_detach_then_logs_follow_and_stop_take_over(slurm, tmp_path):
    """On a terminal Ctrl-C asks; "d" leaves the job running. `logs --follow` then follows it to its
    end, which `stop` brings (the supervisor's own teardown, from another process)."""
    ticker = "import os, time\nfor i in range(600):\n    print('tick', os.environ['TFCLUSTER_TASK_INDEX'], i, flush=True)\n    time.sleep(0.2)"
    spec = write_spec(tmp_path / "spec.yaml", "sl-detach", [PY, "-c", ticker])
    run_dir = tmp_path / "run"
    master, slave = pty.openpty()

    def controlling_tty() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        launch_argv(spec, run_dir),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=_repo(),
        env=env_for(slurm),
        preexec_fn=controlling_tty,
    )
    os.close(slave)
    seen = bytearray()

    def read_until(text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in seen:
            assert time.monotonic() < deadline, seen[-2000:].decode(errors="replace")
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen.extend(os.read(master, 65536))
                except OSError:
                    break

    follower = None
    try:
        read_until(b"tick 2 3", 60)
        os.write(master, b"\x03")  # Ctrl-C, through the terminal's line discipline
        read_until(b"or detach and leave it running (d)?", 20)
        os.write(master, b"d\n")
        read_until(b"detached; Slurm job", 20)
        assert proc.wait(20) == 0
        assert slurm.jobs()  # still running
        follower = subprocess.Popen(
            [PY, "-m", "orchestrator", "logs", str(run_dir), "--follow", "--task", "worker:1"],
            env=env_for(slurm),
            cwd=_repo(),
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)
        stopped = cli(slurm, _repo(), "stop", str(run_dir))
        assert "stopped: job interrupted_sigterm" in stopped.stdout, stopped
        out, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0 and "[worker:1 n2] tick 1" in out and "tick 0 " not in out
        assert result(run_dir)["state"] == "interrupted_sigterm"
    finally:
        os.close(master)
        for p in (proc, follower):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


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
    proc = start(slurm, [*salloc, *launch_argv(spec, first, "-q")], cwd=_repo())
    try:
        wait_for(lambda: "worker:1: step 100" in _log(first), 120, "the loop to run")
        stopped = cli(slurm, _repo(), "stop", str(first))
        assert "stopped: job interrupted_sigterm" in stopped.stdout, stopped
        finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = [int(m) for m in re.findall(r"worker:0: step (\d+)", _log(first))]
    assert all(t["state"] == "stopped" for t in result(first)["tasks"].values())
    second = tmp_path / "run2"
    rc, _out, err = finish(
        start(
            slurm,
            [*salloc, *launch_argv(spec, second, "-q", "--", *loop, "--steps", str(max(printed) + 40))],
            cwd=_repo(),
        ),
        timeout=120,
    )
    assert rc == 0, err[-2000:]
    resumed = int(re.search(r"worker:0: starting at step (\d+)", _log(second)).group(1))
    assert resumed >= max(printed) > 0, (printed, resumed)  # saved on the stop request, not at step 0
    assert re.search(r"worker:1: starting at step (\d+)", _log(second)).group(1) == str(resumed)


@pytest.mark.parametrize(
    "text", ["n[1-3,5]", "n[01-03]", "n[8-10]", "n[08-12],x", "r[1-2]-n[01-02]", "gpu-[001-003],cpu7", "a,b,c", "[3-4]"]
)
def test_the_fallback_expands_host_lists_like_scontrol(slurm, text):
    from worker_entry.agent.modes.hostlist import expand_hostlist

    assert expand_hostlist(text) == slurm.run(["scontrol", "show", "hostnames", text]).stdout.split()


def test_a_busy_tf_port_stops_the_job_before_tensorflow_starts(slurm, tmp_path):
    """With tensorflow.port set the ports are fixed (base + index per shared address): one in use is
    reported by the task's facts and refused at the go, naming the port; nothing ran."""
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = write_spec(tmp_path / "spec.yaml", "sl-port", ["true"], tensorflow={"port": port - 1})
        run_dir = tmp_path / "run"
        argv = ["salloc", "--nodes=3", "--ntasks-per-node=1", "--immediate=30", *launch_argv(spec, run_dir)]
        rc, _out, err = finish(start(slurm, argv, cwd=_repo()), timeout=90)
    assert rc == 4, err[-2000:]
    res = result(run_dir)
    assert res["state"] == "preflight_failed"
    assert res["root_cause"]["task"] == "worker:1" and f"TF port {port}" in res["root_cause"]["message"]


def test_launch_detach_from_the_login_node_submits_and_returns(slurm, tmp_path):
    spec = write_spec(
        tmp_path / "spec.yaml", "sl-detached", ["sh", "-c", "sleep 2; echo finished $TFCLUSTER_TASK_INDEX"]
    )
    run_dir = tmp_path / "run"
    rc, out, err = finish(start(slurm, launch_argv(spec, run_dir, "--detach"), cwd=_repo()), timeout=60)
    assert rc == 0 and "submitted Slurm job" in out, err
    follow = cli(slurm, _repo(), "logs", str(run_dir), "--follow", "--raw", timeout=90)
    assert sorted(line for line in follow.stdout.splitlines() if line.startswith("finished")) == [
        "finished 0",
        "finished 1",
        "finished 2",
    ]
    assert result(run_dir)["state"] == "succeeded"
