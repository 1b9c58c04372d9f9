"""Issue 32.8: failures read as bad as they are, no worse.

- the last lines of a failed task end with its traceback, not with the progress bar the node flushed
  after it; tfcluster's own frames inside a user's traceback are folded into one line that names them;
- a peer that failed on its own (before the stop the launcher sent took effect) is failed with its real
  exit, not "stopped"; a peer the stop ended is still stopped;
- goodput's lost time without a backup names the remedy (BackupAndRestore).

The job-level tests run the real supervisor over fake nodes that speak the real protocol."""

from __future__ import annotations

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, repo_python, run_launch
from fakenode import FakeBackend, FakeNode, make_plan, obedient
from goodput_runs import restart_run
from testbed_fixtures import requires_netns

from orchestrator.job import Job, LaunchOptions
from orchestrator.supervise.lastlines import fold_own_frames, is_bar, tidy
from orchestrator.views.goodput import goodput
from worker_entry import protocol as p

OWN = "/opt/tfcluster/worker_entry/instrument/stepclock/collectives.py"
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/u/train.py", line 40, in <module>',
    "    model.fit(ds, epochs=3)",
    f'  File "{OWN}", line 88, in _all_reduce',
    "    return original(*args, **kwargs)",
    '  File "/opt/tfcluster/worker_entry/instrument/stepclock/stamps.py", line 12, in stamped',
    "    out = fn()",
    '  File "/usr/lib/python3/site-packages/tensorflow/python/ops/collective_ops.py", line 9, in all_reduce',
    "    raise errors.UnavailableError",
    "tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: peer is gone",
]
BAR = "  3/100 [>.............................] - ETA: 2s - loss: 2.3015"


def test_a_bar_flushed_after_the_traceback_goes_before_it_and_the_exception_is_last():
    lines = ["Epoch 1/3", *TRACEBACK, BAR]
    out = tidy(lines)
    assert out[-1].startswith("tensorflow.python.framework.errors_impl.UnavailableError")
    assert out.index(BAR) < out.index(TRACEBACK[0])
    assert len([x for x in out if "ETA" in x]) == 1  # moved, not lost
    # a bar the node sent as an unfinished redraw, whatever its shape, is known by its text
    custom = "step 40 of 100 |#####     |"
    assert tidy([*TRACEBACK, custom], bars=[custom])[-1] == TRACEBACK[-1]
    assert tidy(["a", custom]) == ["a", custom]  # no traceback: nothing moves
    # a bar on stderr overdrawn by the traceback: the line that ended the redraw is the traceback's own
    assert tidy(["x", *TRACEBACK], bars=[TRACEBACK[0]]) == ["x", *fold_own_frames(TRACEBACK)]


def test_tfclusters_own_frames_are_folded_into_one_line_naming_them():
    out = fold_own_frames(TRACEBACK)
    assert not any(OWN in x for x in out)
    folded = [x for x in out if "tfcluster's instrumentation" in x]
    assert folded == [
        "  [2 frames of tfcluster's instrumentation, not your code: "
        "worker_entry/instrument/stepclock/collectives.py in _all_reduce, "
        "worker_entry/instrument/stepclock/stamps.py in stamped]"
    ]
    # the user's frames and TensorFlow's stay, with their source lines
    assert '  File "/home/u/train.py", line 40, in <module>' in out and "    model.fit(ds, epochs=3)" in out
    assert "    raise errors.UnavailableError" in out and out[-1] == TRACEBACK[-1]
    # the examples shipped in worker_entry are user scripts: not folded
    example = ['  File "/opt/tfcluster/worker_entry/examples/keras_synthetic.py", line 5, in main', "    fit()"]
    assert fold_own_frames(example) == example


def _fails_after_a_bar(n: FakeNode) -> None:
    """A Keras script: its bar redrawn (progress frames), then a traceback on stderr, then the node
    flushes the bar's unfinished text as a line (``agent.output.flush_partials``) and exits 1."""
    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=2000))
    n.raw(p.log_frame(p.STDOUT, b"  2/100 [>....] - ETA: 3s\r"))
    n.raw(p.log_frame(p.STDOUT, b"  3/100 [>....] - ETA: 2s\r"))
    n.log("\n".join(TRACEBACK), stream=p.STDERR)
    n.log("  3/100 [>....] - ETA: 2s")  # the flushed bar
    n.exited(1)


def _fails_on_its_own(n: FakeNode) -> None:
    """A peer whose collective fails when the first worker dies: it exits 1 before its node acts on the
    stop (its ``exited`` says it was not stopped)."""
    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=2001))
    n.wait_for(p.Stop)
    n.log("RuntimeError: peer worker:0 is gone", stream=p.STDERR)
    n.exited(1)


def test_a_failed_jobs_root_cause_and_the_peers_states_read_as_they_happened(tmp_path):
    loaded, plan = make_plan(3)
    backend = FakeBackend({"worker:0": _fails_after_a_bar, "worker:1": _fails_on_its_own, "worker:2": obedient})
    opts = LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False)
    result = Job(loaded, plan, opts, backend).run()
    rc = result.root_cause
    assert rc is not None and rc.task == "worker:0", rc
    assert rc.last_lines[-1] == TRACEBACK[-1], rc.last_lines  # the exception last, the bar before the traceback
    assert any("ETA: 2s" in x for x in rc.last_lines[: rc.last_lines.index(TRACEBACK[0])])
    assert any("tfcluster's instrumentation" in x for x in rc.last_lines)
    tasks = result.attempts[-1].tasks
    assert (tasks["worker:1"].state.value, tasks["worker:1"].exit_code) == ("failed", 1)  # on its own
    assert tasks["worker:2"].state.value == "stopped"  # the stop ended it
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert log.count("ETA: 2s") >= 1 and OWN in log  # the task's log keeps every line as printed


def test_lost_training_without_a_backup_names_the_remedy():
    g = goodput(*restart_run(epochs=False))
    assert "BackupAndRestore" in g["attempts"][0]["backup"] and "TFCLUSTER_BACKUP_DIR" in g["attempts"][0]["backup"]


@pytest.mark.e2e
@requires_netns
def test_a_real_keras_failure_ends_with_its_exception_not_the_bar_flushed_after_it(testbed_factory, tmp_path):
    """Real TensorFlow on the namespace bed: worker:1 raises inside `fit` (verbose 1: its bar unfinished on
    stdout, the traceback on stderr). Its node flushes the bar after the traceback — the task's log keeps
    that order — and the root cause's last lines end with the exception, no bar after the traceback."""
    tb = testbed_factory(3, mode="netns")
    spec = tb.write_spec(
        tmp_path / "spec.yaml",
        "fails-read",
        [
            PY,
            str(WORKLOADS / "mwms_job.py"),
            *("--epochs", "2", "--steps", "20", "--step-sleep", "0.05", "--verbose", "1"),
            *("--fail-task", "worker:1", "--fail-epoch", "0", "--fail-raise"),
        ],
        job={"python": repo_python(tmp_path)},
    )
    r = run_launch(tb, spec, tmp_path / "run", "-q", "--no-gather")
    assert r.rc == 3, r.stderr[-3000:]
    rc = r.result["root_cause"]
    assert (rc["task"], rc["exit_code"]) == ("worker:1", 1), rc
    lines = rc["last_lines"]
    assert lines[-1].startswith("RuntimeError: worker:1: injected failure"), lines
    assert any("of tfcluster's instrumentation, not your code: worker_entry/instrument/hooks.py" in x for x in lines)
    assert not any("/worker_entry/instrument/" in x for x in lines), lines  # fit's wrapper folded, not quoted
    if "Traceback (most recent call last):" in lines:
        after = lines[lines.index("Traceback (most recent call last):") :]
        assert not any(is_bar(x) for x in after), lines
    log = [x for x in (tmp_path / "run" / "logs" / "worker-1.log").read_text().splitlines() if x.strip()]
    told = [i for i, x in enumerate(log) if x.startswith("RuntimeError: worker:1: injected failure")]
    assert told and any(is_bar(x) for x in log[told[-1] + 1 :]), log[-5:]  # as printed: the bar after it
    for peer in ("worker:0", "worker:2"):  # stopped by tfcluster, or failed on their own with their real exit
        t = r.result["tasks"][peer]
        assert t["state"] in ("stopped", "failed"), t
        if t["state"] == "failed":
            assert t["reason"] is None and (t["exit_code"] is not None or t["signal"]), t
    assert_no_job_processes(tb, 10)
