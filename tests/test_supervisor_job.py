"""The job around the supervisor, over in-process fake nodes: result.json for a protocol error, every
unreachable host reported with nothing run, restarts of every task, and closed channels decided on
their exit status, its wait, or as the root cause while it is awaited.
"""

from __future__ import annotations

import json
import threading

from fakenode import FakeBackend, FakeNode, healthy, make_plan
from supervising import exit_code_for_state, supervise
from waiting import wait_for

from orchestrator.cli.exitcodes import exit_code_for
from orchestrator.core.states import JobState, TaskState
from orchestrator.job import Job, LaunchOptions
from worker_entry import protocol as p


def test_the_job_writes_result_json_for_a_protocol_error(tmp_path):
    def hostile(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.send({"type": "exited", "code": "zero"})
        n.idle(5)

    loaded, plan = make_plan(3)
    backend = FakeBackend({"worker:2": hostile})
    job = Job(
        loaded, plan, LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False), backend
    )
    result = job.run()
    assert exit_code_for(result) == 3
    data = json.loads((tmp_path / "run" / "result.json").read_text())
    assert data["state"] == "failed"
    assert data["root_cause"]["kind"] == "protocol" and data["root_cause"]["task"] == "worker:2"
    assert "exited.code: expected an integer" in data["root_cause"]["message"]
    assert data["root_cause"]["hint"]
    assert backend.closed
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert events[0] == "job_started" and events[-1] == "job_finished" and "protocol_error" in events


def test_the_job_reports_every_unreachable_host_and_runs_nothing(tmp_path):
    loaded, plan = make_plan(3)
    backend = FakeBackend({}, unreachable=["worker:0", "worker:2"])
    result = Job(loaded, plan, LaunchOptions(run_dir=str(tmp_path / "r"), live=False, echo_logs=False), backend).run()
    assert result.state == JobState.CONNECT_FAILED and exit_code_for(result) == 4
    assert not backend.history
    assert "cannot reach 2 host(s)" in result.root_cause.message


def test_the_job_restarts_every_task_after_a_failure(tmp_path):
    attempts: list[int] = []

    def fails_first_time(n: FakeNode) -> None:
        attempts.append(n.config.attempt)
        healthy(0.2, code=1 if n.config.attempt == 0 else 0)(n)

    loaded, plan = make_plan(2, restart={"max_restarts": 2})
    backend = FakeBackend({"worker:1": fails_first_time, "worker:0": healthy(0.2)})
    result = Job(
        loaded, plan, LaunchOptions(run_dir=str(tmp_path / "r"), gather=False, live=False, echo_logs=False), backend
    ).run()
    assert result.state == JobState.SUCCEEDED and len(result.attempts) == 2
    assert attempts == [0, 1]
    assert [a.state for a in result.attempts] == [JobState.FAILED, JobState.SUCCEEDED]
    assert (tmp_path / "r" / "logs" / "worker-1.attempt-1.log").exists()


def _output_ends_then(status_after, then=None):
    """A node whose channel ends after the go without an ``exited`` (its worker_entry died); once the
    launcher asked for the exit status, ``status_after(n)`` (the status that follows, or the supervisor's
    time moving on), then ``then``."""

    def script(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.log("worker_entry: going away")
        n.chan.end_output()
        wait_for(lambda: n.chan.asked, 10, "the launcher to ask for the exit status")
        status_after(n)
        if then is not None:
            then.set()
        n.idle(30)  # until the launcher closes the channel (its status stays as it is meanwhile)

    return script


def test_a_closed_channel_is_decided_when_its_exit_status_comes_without_sleeping_for_it():
    """The exit status arrives after the end of the output: the loop looks again on its next passes (it
    does not sleep-poll), and the status names the cause (127: the interpreter is missing)."""

    def status_127(n: FakeNode) -> None:
        n.clock.advance(0.1)  # within the wait for it (0.2 s of the supervisor's time)
        n.chan.status = 127

    res, rec, _ = supervise({"worker:0": _output_ends_then(status_127)}, n_hosts=1, frozen=True)
    rc = res.root_cause
    assert (rc.kind, rc.task, rc.exit_code) == ("lost", "worker:0", 127)
    assert rc.message == "cannot run 'python3' on the host (exit 127)" and "job.python" in rc.hint
    assert [e.status for e in rec.kinds("task_lost")] == [127]


def test_an_agent_that_raised_on_a_reachable_host_is_not_a_lost_host():
    """worker_entry itself raised (its traceback on the channel's stderr, exit 1): a tfcluster bug on a
    host that answered, not a host lost for good — the attempt policy restarts in place and blames no
    host (a kernel counter once killed a healthy worker's agent this way, and its host was left out)."""
    from orchestrator.job.policy import host_to_blame

    def crashed(n: FakeNode) -> None:
        n.chan.status = 1

    def script(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.chan.write_err(
            b'Traceback (most recent call last):\n  File "/x/worker_entry/agent/runner.py", line 3, in _heartbeat\n'
            b"worker_entry.protocol.frames.ProtocolError: tcp_retrans_pct: expected a value in [0, 100], got 200.0\n"
        )
        n.chan.end_output()
        wait_for(lambda: n.chan.asked, 10, "the launcher to ask for the exit status")
        crashed(n)
        n.idle(30)

    res, rec, _ = supervise({"worker:0": script}, n_hosts=1, frozen=True)
    rc = res.root_cause
    assert (rc.kind, rc.task, rc.exit_code) == ("agent", "worker:0", 1), rc
    assert rc.message.startswith("worker_entry failed on the host (exit 1): worker_entry.protocol.frames.ProtocolError")
    assert "tfcluster bug" in rc.hint
    assert host_to_blame(res) is None
    assert [e.status for e in rec.kinds("task_lost")] == [1]  # its channel did close: the event says so
    assert res.state == JobState.FAILED and exit_code_for_state(res.state) == 3


def test_a_closed_channel_whose_exit_status_never_comes_is_lost_after_its_wait():
    def time_passes(n: FakeNode) -> None:
        n.clock.advance(0.3)  # past the wait for it

    res, _rec, _ = supervise({"worker:0": _output_ends_then(time_passes)}, n_hosts=1, frozen=True)
    rc = res.root_cause
    assert (rc.kind, rc.exit_code) == ("lost", None)
    assert rc.message == "connection closed without an exit status (channel status None)"
    assert rc.last_lines[-1] == "worker_entry: going away"


def test_a_channel_that_closed_first_is_the_root_cause_even_while_its_exit_status_is_awaited():
    """worker:0's channel ends (its status never comes: the clock stands still); then worker:1 exits 1:
    worker:0 is decided first — it came first — so it is the root cause, as when the loop slept until it
    knew worker:0's status. worker:1's node says it ended on its own (not by the stop the teardown sent):
    failed with its real exit, after the root cause (issue 32.8: not "stopped EXIT 1")."""
    closed = threading.Event()

    def fails_after(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=6))
        closed.wait(10)
        n.exited(1)

    scripts = {"worker:0": _output_ends_then(lambda n: None, then=closed), "worker:1": fails_after}
    res, rec, _ = supervise(scripts, n_hosts=2, frozen=True)
    assert (res.root_cause.task, res.root_cause.kind) == ("worker:0", "lost")
    assert [f.task for f in res.failures] == ["worker:0", "worker:1"]
    assert (res.tasks["worker:1"].state, res.tasks["worker:1"].exit_code) == (TaskState.FAILED, 1)
    (teardown,) = rec.kinds("teardown")
    assert teardown.reason.startswith("worker:0 (10.0.0.1): connection closed without an exit status")
