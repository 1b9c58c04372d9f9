"""Roles end to end on the namespace test bed, with real TensorFlow on CPU and this checkout's
worker_entry on the nodes:

- ParameterServerStrategy (1 chief running a ClusterCoordinator loop, 2 workers, 1 ps): a worker
  SIGKILLed mid-run is restarted in place and the job still succeeds when the chief ends (the servers,
  which never exit by themselves, stopped); the ps SIGKILLed tears the job down with the ps as root cause;
- MWMS with a sidecar evaluator (tf.keras.utils.SidecarEvaluator on the checkpoint directory): the
  evaluator evaluates a checkpoint, with the metrics it printed in the launcher's events, status and
  report; SIGKILLed, it is reported and the training goes on to succeed.

Few and short on purpose (CI runs on 2 cores): each test is one job of ~4 TensorFlow processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from conftest import PY, assert_no_job_processes, jsonl, read_events, repo_python, run_cli, start_launch
from testbed_fixtures import requires_netns
from waiting import wait_for

from orchestrator.runs import RunDir, read_plan

pytestmark = [pytest.mark.e2e, requires_netns]


def _launch(tb, tmp_path: Path, name: str, command: list[str], roles: list[dict], *, gather: bool = False, **sections):
    spec = tb.spec_dict(
        name,
        command,
        job={"python": repo_python(tmp_path), "stop_grace_s": 2},
        heartbeat={"interval_s": 0.5, "timeout_s": 5.0},
        **sections,
    )
    for i, (host, r) in enumerate(zip(spec["hosts"], roles, strict=True)):
        host["roles"] = r
        host["tf_port"] = 24000 + 10 * i  # a host's tasks take consecutive ports from here
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_dir = tmp_path / "run"
    return start_launch(tb, path, run_dir, *([] if gather else ["--no-gather"]), "-q"), run_dir


def _finish(proc, timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def _pid(run_dir: Path, task: str) -> int | None:
    """The training process of ``task`` (its latest incarnation), from its task_spawned event."""
    pids = [e["pid"] for e in read_events(run_dir) if e["event"] == "task_spawned" and e.get("task") == task]
    return pids[-1] if pids else None


def _log(run_dir: Path, slug: str) -> str:
    path = run_dir / "logs" / f"{slug}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _guarded(proc, fn):
    try:
        return fn()
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


PS_ROLES = [{"chief": 1}, {"worker": 2}, {"ps": 1}]
PS_LOOP = [PY, "-m", "worker_entry.examples.ps_coordinator", "--log-every", "10"]


def test_ps_worker_sigkilled_is_restarted_and_the_job_succeeds(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir = _launch(
        tb,
        tmp_path,
        "ps-kill-worker",
        [
            *PS_LOOP,
            "--steps",
            "600",
            "--step-ms",
            "40",
        ],  # ~20 s after the kill: its restart (a TF import) is back long before
        PS_ROLES,
        gather=True,
        tensorflow={"strategy": "parameter_server"},
    )

    def kill_worker() -> None:
        wait_for(lambda: "step 20/" in _log(run_dir, "chief-0"), 180, "the coordinator's first steps")
        os.kill(_pid(run_dir, "worker:1"), signal.SIGKILL)

    _guarded(proc, kill_worker)
    code, err = _finish(proc)
    assert code == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded" and result["root_cause"] is None
    events = read_events(run_dir)
    (rf,) = [e for e in events if e["event"] == "role_failure"]
    assert (rf["task"], rf["kind"], rf["action"], rf["restarts"]) == ("worker:1", "signal", "restart", 1)
    assert len([e for e in events if e["event"] == "task_spawned" and e["task"] == "worker:1"]) == 2
    assert "step 600/600" in _log(run_dir, "chief-0")
    assert _log(run_dir, "worker-1").count("server up at") == 2  # it came back on its own port
    # its first incarnation's task directory moved into the restarted one's (earlier/), gathered with it
    remote = Path(read_plan(RunDir(run_dir)).task_dir("worker:1")).expanduser()
    first = remote / "attempt-0-restart-1" / "earlier" / "attempt-0" / "output.log"
    assert "server up at" in first.read_text() and not (remote / "attempt-0").exists()
    (end,) = [e for e in events if e["event"] == "training_ended"]
    assert end["stopping"] == 3
    tasks = result["tasks"]
    assert tasks["chief:0"]["state"] == "succeeded"
    assert {tasks[t]["state"] for t in ("worker:0", "worker:1", "ps:0")} == {"stopped"}
    status = run_cli("status", str(run_dir))
    assert status.returncode == 0 and "worker:1 (restarted 1x)" in status.stdout, status.stdout + status.stderr
    # the coordinator's steps are the job's progress (report_step), every one of them counted
    assert json.loads((run_dir / "status.json").read_text())["tasks"]["chief:0"]["steps"] == 600
    report = run_cli("report", str(run_dir))
    assert report.returncode == 0 and "roles (parameter_server):" in report.stdout, report.stdout + report.stderr
    assert "killed by SIGKILL; restarted in place (1)" in report.stdout
    assert "training ended: stopping worker:0, worker:1, ps:0" in report.stdout
    assert_no_job_processes(tb, 10)


def test_ps_sigkilled_tears_the_job_down_with_the_ps_as_root_cause(testbed_factory, tmp_path):
    tb = testbed_factory(3, mode="netns")
    proc, run_dir = _launch(
        tb,
        tmp_path,
        "ps-kill-ps",
        [*PS_LOOP, "--steps", "100000", "--step-ms", "20"],
        PS_ROLES,
        tensorflow={"strategy": "parameter_server"},
    )

    def kill_ps() -> None:
        wait_for(lambda: "step 10/" in _log(run_dir, "chief-0"), 180, "the coordinator's first steps")
        os.kill(_pid(run_dir, "ps:0"), signal.SIGKILL)

    _guarded(proc, kill_ps)
    code, err = _finish(proc)
    assert code == 3, err[-3000:]
    rc = json.loads((run_dir / "result.json").read_text())["root_cause"]
    assert (rc["task"], rc["kind"], rc["signal"]) == ("ps:0", "signal", "SIGKILL")
    assert not [e for e in read_events(run_dir) if e["event"] == "role_failure"]
    assert_no_job_processes(tb, 10)


def test_mwms_sidecar_evaluator_evaluates_then_ends(testbed_factory, tmp_path):
    tb = testbed_factory(2, mode="netns")
    command = [
        PY,
        "-m",
        "worker_entry.examples.sidecar_eval",
        "--epochs",
        "3",
        "--steps-per-epoch",
        "10",
        "--epoch-sleep-s",
        "1",
    ]
    proc, run_dir = _launch(
        tb,
        tmp_path,
        "sidecar-ends",
        command,
        [{"worker": 1}, {"worker": 1, "evaluator": 1}],
        tensorflow={"communication": "ring"},
    )
    code, err = _finish(proc, 180)
    assert code == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded" and result["root_cause"] is None
    log = _log(run_dir, "evaluator-0")
    assert "evaluated the checkpoint of step" in log, log[-3000:]
    events = read_events(run_dir)
    assert not [e for e in events if e["event"] == "role_failure"]
    # it ended: by itself after the last checkpoint (max_evaluations), or stopped once the training ended
    ended = result["tasks"]["evaluator:0"]["state"]
    if ended == "succeeded":
        assert "evaluated the checkpoint of step 30" in log and "[evaluator:0] done" in log
    else:
        assert ended == "stopped"
        (end,) = [e for e in events if e["event"] == "training_ended"]
        assert end["stopping"] == 1
    assert {result["tasks"][t]["state"] for t in ("worker:0", "worker:1")} == {"succeeded"}
    _assert_evaluations_as_logged(run_dir, log, events)
    assert_no_job_processes(tb, 10)


def _assert_evaluations_as_logged(run_dir: Path, log: str, events: list[dict]) -> None:
    """The evaluations the evaluator printed (step, metrics to 4 decimals) are the launcher's: one
    ``evaluation`` event each, the last in status.json and `status`, every one in `report`."""
    said = [re.search(r"evaluated the checkpoint of step (\d+): (.*)$", line) for line in log.splitlines()]
    printed = [
        (int(m[1]), dict(zip(m[2].split()[::2], map(float, m[2].split()[1::2]), strict=True))) for m in said if m
    ]
    evals = [e for e in events if e["event"] == "evaluation"]
    assert printed and len(evals) == len(printed), (printed, evals)
    for (step, metrics), e in zip(printed, evals, strict=True):
        assert e["task"] == "evaluator:0" and e["step"] == step and e["source"] == "sidecar"
        assert e["checkpoint"].endswith(f"ckpt-{step // 10}") and set(e["metrics"]) == set(metrics) == {"loss", "mae"}
        assert all(abs(e["metrics"][k] - v) <= 5e-5 for k, v in metrics.items()), (e["metrics"], metrics)
    entry = json.loads((run_dir / "status.json").read_text())["tasks"]["evaluator:0"]["evaluation"]
    assert (
        entry["evaluations"] == len(evals)
        and entry["metrics"] == evals[-1]["metrics"]
        and entry["step"] == printed[-1][0]
    )
    status = run_cli("status", str(run_dir))
    assert f"evaluator:0: {len(evals)} evaluation(s); last: checkpoint ckpt-{printed[-1][0] // 10}" in status.stdout
    report = run_cli("report", "--json", str(run_dir))
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["evaluations"]["evaluator:0"]
    assert [(r["step"], r["metrics"]) for r in rows] == [(e["step"], e["metrics"]) for e in evals]
    text = run_cli("report", str(run_dir)).stdout
    assert f"evaluations of evaluator:0 ({len(evals)}, as it reported them):" in text


def test_mwms_sidecar_evaluator_evaluates_and_its_death_does_not_stop_training(testbed_factory, tmp_path):
    tb = testbed_factory(2, mode="netns")
    command = [
        PY,
        "-m",
        "worker_entry.examples.sidecar_eval",
        "--epochs",
        "6",
        "--steps-per-epoch",
        "10",
        "--epoch-sleep-s",
        "1.5",
    ]
    proc, run_dir = _launch(
        tb,
        tmp_path,
        "sidecar",
        command,
        [{"worker": 1}, {"worker": 1, "evaluator": 1}],
        tensorflow={"communication": "ring"},
    )

    def kill_evaluator() -> int:
        wait_for(
            lambda: "evaluated the checkpoint of step" in _log(run_dir, "evaluator-0"),
            180,
            "the evaluator's first evaluation",
        )
        pid = _pid(run_dir, "evaluator:0")
        os.kill(pid, signal.SIGKILL)
        return pid

    _guarded(proc, kill_evaluator)
    killed_at = time.time()
    code, err = _finish(proc)
    assert code == 0, err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "succeeded" and result["root_cause"] is None
    (rf,) = [e for e in read_events(run_dir) if e["event"] == "role_failure"]
    assert (rf["task"], rf["kind"], rf["action"]) == ("evaluator:0", "signal", "report")
    assert result["tasks"]["evaluator:0"]["state"] == "failed"
    assert {result["tasks"][t]["state"] for t in ("worker:0", "worker:1")} == {"succeeded"}
    # the workers trained on after the evaluator died: their last epoch ended after it
    done = [e["ts"] for e in read_events(run_dir) if e["event"] == "task_exited" and e["task"].startswith("worker")]
    assert min(done) > killed_at
    assert_no_job_processes(tb, 10)


def _printed(run_dir: Path, text: str, nth: int = 0) -> float:
    """When the chief printed its ``nth`` line containing ``text`` (combined.log's time of the line)."""
    lines = [ln for ln in (run_dir / "combined.log").read_text().splitlines() if "[chief:0 " in ln and text in ln]
    return datetime.strptime(lines[nth].split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


TUTORIAL = {"fit_epochs": 2, "fit_steps": 20, "loop_epochs": 4, "loop_steps": 5, "eval_steps": 2}


def test_the_ps_tutorial_fit_then_its_coordinator_loop_is_counted_on_the_chief(testbed_factory, tmp_path):
    """Issue 32.1: TensorFlow's parameter-server tutorial as a user runs it (``examples/ps_tutorial``: the
    notebook's code, no tfcluster call): ``Model.fit``, then a ``ClusterCoordinator`` loop of 4 x 5 steps
    and one more, then 2 scheduled evaluation steps. The chief's steps are fit's and the loop's, each once
    (the evaluation is no training step); the loop is training in ``report``'s split, not "after the last
    step"; ``status`` and ``report`` name the chief and the ps by role."""
    tb = testbed_factory(3, mode="netns")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TUTORIAL.items()]
    proc, run_dir = _launch(
        tb,
        tmp_path,
        "ps-tutorial",
        [PY, "-m", "worker_entry.examples.ps_tutorial", *flags],
        PS_ROLES,
        tensorflow={"strategy": "parameter_server"},
    )
    code, err = _finish(proc, timeout=300)
    assert code == 0, err[-3000:]
    log = _log(run_dir, "chief-0")
    assert "Finished epoch 3" in log and "Final loss is" in log and log.count("Evaluation accuracy") == 2, log[-3000:]
    fit = TUTORIAL["fit_epochs"] * TUTORIAL["fit_steps"]
    loop = TUTORIAL["loop_epochs"] * TUTORIAL["loop_steps"] + 1  # the notebook schedules one more for its loss
    status = json.loads((run_dir / "status.json").read_text())
    assert status["tasks"]["chief:0"]["steps"] == fit + loop, status["tasks"]["chief:0"]
    chief = [r for r in jsonl(run_dir / "heartbeats.jsonl") if r.get("task") == "chief:0" and r.get("progress")]
    train = [r["progress"] for r in chief if r["progress"].get("phase", "train") == "train"]
    assert max(p["steps"] for p in train) == fit + loop  # never more on the way: nothing counted twice
    # the training ends with the loop's last step: after the loss the last step returned was printed, at the
    # latest when the scheduled evaluation's join returned (the line printed right after it)
    last = max(p["ts"] for p in train)
    assert _printed(run_dir, "Final loss is") - 0.5 <= last <= _printed(run_dir, "Evaluation accuracy", 1) + 0.01
    report = json.loads(run_cli("report", str(run_dir), "--json").stdout)
    goodput = report["goodput"]
    finished = next(e["ts"] for e in read_events(run_dir) if e["event"] == "job_finished")
    # "after the last step" holds no part of the loop: at most what came after its last step's loss
    assert goodput["teardown_s"] <= finished - _printed(run_dir, "Final loss is") + 0.1, goodput
    first_loop_step = _printed(run_dir, "Finished epoch 0")
    assert goodput["productive_s"] > 0 and last > first_loop_step, goodput
    text = run_cli("report", str(run_dir)).stdout
    assert "roles (parameter_server):" in text, text
    for shown in (text, run_cli("status", str(run_dir)).stdout):  # each task's row under its role's name
        rows = {ln.split()[0] for ln in shown.splitlines() if re.match(r"^(chief|worker|ps):\d ", ln)}
        assert rows == {"chief:0", "worker:0", "worker:1", "ps:0"}, shown
    assert_no_job_processes(tb, 10)
