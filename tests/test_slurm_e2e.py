"""tfcluster on a real Slurm (slurmctld + three slurmd on this machine) with real TensorFlow.

From the "login node" (this shell, no SLURM_JOB_ID): `launch` submits a batch job whose supervisor
runs in the allocation and follows it; inside an allocation (salloc): `launch` runs one srun step.
Faults: a task SIGKILLed, `stop`, a pending job cancelled, sbatch refusing; Ctrl-C on a terminal, the
host-list fallback, a busy TF port, `--detach`. Requeues and resumes are in test_slurm_requeue_e2e.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import termios
import time
from pathlib import Path

import pytest
from slurm_fixtures import (
    PY,
    REPO,
    cli,
    env_for,
    events,
    finish,
    launch_argv,
    result,
    run_log,
    run_status,
    start,
    tasks_saying,
    write_spec,
)
from waiting import wait_for

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
    # ``HOLD.waiting.PID``: this task's training process has exited and the shell waits (a "done" printed
    # is not that: TensorFlow's exit can take seconds on a loaded box, and its RELEASED would come late)
    waiting = shlex.quote(f"{hold}.waiting.")
    wait = (
        f"; rc=$?; : > {waiting}$$; until [ -e {shlex.quote(str(hold))} ]; do sleep 0.1; done; echo RELEASED; exit $rc"
    )
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
    proc = start(slurm, launch_argv(spec, run_dir), cwd=REPO)
    try:
        wait_for(lambda: "strategy ready" in run_log(run_dir), 120, "the tasks to run")
        # Slurm keeps the job's environment and script (slurmctld's state, slurmd's spool): not the credential
        forms = _encodings(token)
        in_slurm = [p for p in slurm.dir.rglob("*") if p.is_file() and any(f in _bytes(p) for f in forms)]
        private = run_dir / "slurm" / "private-spec.json"
        private_while_running = (
            (private.stat().st_mode & 0o777, token in private.read_text()) if private.exists() else None
        )
        # released once every task has trained, its TensorFlow process has exited and its shell waits for
        # the file: then all three print RELEASED within ~0.1 s (released while the chief still finished
        # its last epoch, or while one process still exited, its line came > 1 s later)
        wait_for(lambda: all(f"worker:{i}: done" in run_log(run_dir) for i in range(3)), 120, "every task done")
        wait_for(lambda: len(list(tmp_path.glob("checked.waiting.*"))) == 3, 120, "every task waiting for the file")
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
    st = cli(slurm, REPO, "status", str(run_dir), "--json")
    status = json.loads(st.stdout)
    assert status["state"] == "succeeded" and status["slurm"]["state"] == "COMPLETED"
    assert status["slurm"]["job_ids"] == [json.loads((run_dir / "slurm" / "submitted.json").read_text())["job_id"]]
    assert cli(slurm, REPO, "report", str(run_dir)).returncode == 0
    logs = cli(slurm, REPO, "logs", str(run_dir), "--task", "worker:2", "--raw").stdout
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
    rc, out, err = finish(start(slurm, argv, cwd=REPO), timeout=150)
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


@pytest.mark.parametrize("victim", ["training", "worker_entry"])
def test_sigkill_of_one_task_takes_the_whole_step_down(slurm, tmp_path, victim):
    """SIGKILL of worker:1's training process (worker_entry reports it) or of the Slurm task itself
    (worker_entry: its channel closes, --kill-on-bad-exit ends the step): every task gone, root cause."""
    pids = tmp_path / "pids"
    pids.mkdir()
    cmd = mwms("--epochs", "50", "--steps", "20", "--step-sleep", "0.02", "--pid-dir", str(pids))
    spec = write_spec(tmp_path / "spec.yaml", "sl-kill", cmd)
    run_dir = tmp_path / "run"
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=REPO)
    try:
        wait_for(lambda: "worker:2: epoch 1 begins" in run_log(run_dir), 120, "training to run")
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
    proc = start(slurm, launch_argv(spec, run_dir, "-q"), cwd=REPO)
    try:
        wait_for(lambda: "worker:0: epoch 1 begins" in run_log(run_dir), 120, "training to run")
        st = json.loads(cli(slurm, REPO, "status", str(run_dir), "--json").stdout)
        assert st["state"] == "running" and st["slurm"]["state"] == "RUNNING" and st["slurm"]["nodes"] == "n[1-3]"
        assert {t["host"] for t in st["tasks"].values()} == {"n1", "n2", "n3"}
        stopped = cli(slurm, REPO, "stop", str(run_dir))
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
    proc = start(slurm, launch_argv(spec, run_dir), cwd=REPO)
    try:
        wait_for(lambda: "PENDING" in json.dumps(run_status(slurm, run_dir)), 30, "the job to pend")
        assert run_status(slurm, run_dir)["state"] == "pending"
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
    rc, _out, err = finish(start(slurm, launch_argv(spec, run_dir), cwd=REPO), timeout=60)
    assert rc == 4, err
    res = result(run_dir)
    assert res["state"] == "start_failed"
    assert res["root_cause"]["kind"] == "scheduler" and "invalid partition" in res["root_cause"]["message"].lower()
    assert "sbatch refused the job" in err


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
        cwd=REPO,
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
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)
        stopped = cli(slurm, REPO, "stop", str(run_dir))
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
        rc, _out, err = finish(start(slurm, argv, cwd=REPO), timeout=90)
    assert rc == 4, err[-2000:]
    res = result(run_dir)
    assert res["state"] == "preflight_failed"
    assert res["root_cause"]["task"] == "worker:1" and f"TF port {port}" in res["root_cause"]["message"]


def test_launch_detach_from_the_login_node_submits_and_returns(slurm, tmp_path):
    spec = write_spec(
        tmp_path / "spec.yaml", "sl-detached", ["sh", "-c", "sleep 2; echo finished $TFCLUSTER_TASK_INDEX"]
    )
    run_dir = tmp_path / "run"
    rc, out, err = finish(start(slurm, launch_argv(spec, run_dir, "--detach"), cwd=REPO), timeout=60)
    assert rc == 0 and "submitted Slurm job" in out, err
    follow = cli(slurm, REPO, "logs", str(run_dir), "--follow", "--raw", timeout=90)
    assert sorted(line for line in follow.stdout.splitlines() if line.startswith("finished")) == [
        "finished 0",
        "finished 1",
        "finished 2",
    ]
    assert result(run_dir)["state"] == "succeeded"
