"""The supervisor and the job over an in-process fake node: no sshd, no TensorFlow, real protocol.

Teardown order, root-cause choice, the startup deadline, lost/hung verdicts and protocol violations,
through the real pump, decoder, sessions, supervisor, job, sinks and result.json.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading

import pytest
from fakenode import FakeBackend, FakeClock, FakeNode, healthy, make_plan, obedient, stopped
from waiting import wait_for

from orchestrator.cli.exitcodes import exit_code_for
from orchestrator.core.states import JobState, TaskState
from orchestrator.events import EventBus
from orchestrator.job import Job, LaunchOptions
from orchestrator.supervise import Interrupt, Supervisor
from worker_entry import protocol as p


class Recorder:
    """Event sink + log sink + heartbeat sink in one, keeping everything in order."""

    def __init__(self) -> None:
        self.events: list = []
        self.lines: dict[str, bytes] = {}
        self.beats: list = []

    def handle(self, ev) -> None:
        """Every event the supervisor emits must read back from its events.jsonl line as it was."""
        line = json.loads(json.dumps(ev.to_dict()))
        assert type(ev).from_dict(line) == dataclasses.replace(ev, ts=round(ev.ts, 3)), line
        self.events.append(ev)

    def close(self) -> None:
        pass

    def write(self, task, data, ts=None) -> None:
        if isinstance(data, dict):
            self.beats.append((task, data))
        else:
            self.lines[task] = self.lines.get(task, b"") + data

    def flush(self) -> None:
        pass

    def kinds(self, kind: str) -> list:
        return [e for e in self.events if e.event == kind]


def supervise(scripts, n_hosts=3, interrupt=None, bound=None, rec=None, frozen=False, **sections):
    """The real supervisor over fake nodes, on the backend's ``FakeClock`` (scripts move it on; ``frozen``:
    only they do); ``rec``: the recorder to use (a script may wait for what the supervisor has heard)."""
    loaded, plan = make_plan(n_hosts, **sections)
    backend = FakeBackend(scripts, clock=FakeClock())
    if frozen:
        backend.clock.freeze()
    rec = rec if rec is not None else Recorder()
    sup = Supervisor(
        loaded.spec,
        plan,
        backend,
        attempt=0,
        bus=EventBus([rec]),
        logs=rec,
        heartbeats=rec,
        interrupt=interrupt or Interrupt(),
        clock=backend.clock,
        bound=bound,
    )
    try:
        res = sup.run()
    finally:
        backend.close()
    return res, rec, backend


def test_healthy_tasks_succeed_and_go_comes_after_every_hello():
    res, rec, backend = supervise({f"worker:{i}": healthy(0.2) for i in range(3)})
    assert res.state == JobState.SUCCEEDED and res.root_cause is None
    assert {t.state for t in res.tasks.values()} == {TaskState.SUCCEEDED}
    order = [e.event for e in rec.events if e.event in ("task_ready", "task_spawned")]
    assert order[:3] == ["task_ready"] * 3 and order[3:] == ["task_spawned"] * 3
    first = [next(c for c in n.received if not isinstance(c, p.Ping)) for n in backend.nodes.values()]
    assert all(isinstance(c, p.Go) for c in first)
    assert b"worker:1: training" in rec.lines["worker:1"]


def test_a_failing_task_is_the_root_cause_and_its_peers_are_stopped_after_it():
    res, rec, backend = supervise({"worker:1": healthy(0.3, code=3)})
    assert res.state == JobState.FAILED
    rc = res.root_cause
    assert (rc.task, rc.kind, rc.exit_code, rc.host) == ("worker:1", "exit", 3, "10.0.0.2")
    assert rc.last_lines[-1] == "worker:1: failing with 3"
    states = {t: r.state for t, r in res.tasks.items()}
    assert states == {"worker:0": TaskState.STOPPED, "worker:1": TaskState.FAILED, "worker:2": TaskState.STOPPED}
    kinds = [e.event for e in rec.events]
    first_exit = kinds.index("task_exited")
    assert rec.events[first_exit].task == "worker:1"
    assert kinds.index("teardown") > first_exit  # the failure first, then the teardown of the others
    for t in ("worker:0", "worker:2"):
        stop = next(c for c in backend.nodes[t].received if isinstance(c, p.Stop))
        assert stop.grace_s == pytest.approx(0.2) and "worker:1" in stop.reason


def test_startup_deadline_when_a_node_never_says_hello():
    rec = Recorder()

    def silent(n: FakeNode) -> None:
        n.raw(p.MARKER)
        wait_for(lambda: len(rec.kinds("task_ready")) == 2, 10, "the other two nodes' hellos")
        n.clock.advance(6.0)  # past job.startup_timeout_s for the supervisor, however slow the others were
        n.idle(10)  # never says hello; leaves on the stop (or EOF)

    res, rec, backend = supervise({"worker:2": silent}, rec=rec, job={"startup_timeout_s": 5})
    assert res.root_cause.kind == "startup_timeout" and res.root_cause.task == "worker:2"
    (gone,) = [e for e in rec.kinds("task_exited") if e.task == "worker:2"]  # its channel closed, no exit status
    assert gone.to_dict() | {"ts": 0} == {
        "ts": 0,
        "event": "task_exited",
        "task": "worker:2",
        "host": "10.0.0.3",
        "code": None,
        "signal": None,
        "signal_name": None,
        "stopped": True,
        "reason": "channel closed during teardown",
    }
    assert not any(isinstance(c, p.Go) for n in backend.nodes.values() for c in n.received)
    assert res.state == JobState.FAILED and exit_code_for_state(res.state) == 3


def test_a_silent_worker_is_lost_and_blamed():
    def goes_silent(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.heartbeat(state="running")
        n.let_pass(1.5)  # the network is gone: nothing more from here, past heartbeat.timeout_s (1.0)
        n.idle(30)

    res, rec, _ = supervise({"worker:0": goes_silent})
    assert res.root_cause.kind == "lost" and res.root_cause.task == "worker:0"
    assert rec.kinds("worker_lost")[0].silent_s >= 1.0
    assert res.tasks["worker:0"].state == TaskState.LOST


def test_a_stopped_process_is_hung():
    def sigstopped(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        stopped(n, n.run_until_stopped(state="stopped"))

    res, rec, _ = supervise({"worker:1": sigstopped})
    assert res.root_cause.kind == "hung" and res.root_cause.task == "worker:1"
    assert rec.kinds("worker_hung")[0].state == "stopped"


def test_a_peer_silent_before_the_failure_is_blamed_instead_of_the_one_that_failed():
    rec = Recorder()

    def dies_quietly(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.heartbeat(state="running")
        n.idle(30)

    def fails_later(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=6))
        wait_for(lambda: any(t == "worker:0" for t, _ in rec.beats), 5, "worker:0's last heartbeat, heard")
        n.heartbeat(state="running")
        n.clock.advance(0.5)  # > 3 heartbeat intervals (0.3 s) of silence from worker:0, < its 5 s timeout
        heard = sum(t == "worker:1" for t, _ in rec.beats)
        n.heartbeat(state="running")
        # heard after the jump: the launcher has read past it (silence counts up to what it has read,
        # and the fake clock jumps 0.5 s at once, where a real pump's pass lags by milliseconds)
        wait_for(lambda: sum(t == "worker:1" for t, _ in rec.beats) > heard, 5, "worker:1's beat after the jump")
        n.log("UnavailableError: peer worker:0 is gone", p.STDERR)
        n.exited(1)

    res, _rec, _ = supervise(
        {"worker:0": dies_quietly, "worker:1": fails_later}, n_hosts=2, rec=rec, heartbeat={"timeout_s": 5.0}
    )
    rc = res.root_cause
    assert rc.task == "worker:0" and rc.kind == "lost", rc
    assert [f.task for f in res.failures][:2] == ["worker:0", "worker:1"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"type":"heartbeat","seq":"x"}', "heartbeat.seq"),
        (b'{"type":"heartbeat","seq":1,"progress":{"steps":-4}}', "heartbeat.progress.steps"),
        (b'{"type":"launch_missiles"}', "type"),
        (b"[1,2,3]", None),
        (b"{" * 50000, None),
    ],
)
def test_a_malformed_message_fails_that_task_with_a_protocol_error(payload, field):
    def hostile(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        n.raw(p.HEADER.pack(p.T_MSG, 0, len(payload)) + payload)
        stopped(n, n.run_until_stopped())

    res, rec, backend = supervise({"worker:1": hostile})
    rc = res.root_cause
    assert rc.kind == "protocol" and rc.task == "worker:1"
    assert rc.message.startswith("protocol error from 10.0.0.2: ")
    if field:
        assert field in rc.message
    assert res.state == JobState.FAILED
    assert res.tasks["worker:1"].state == TaskState.FAILED
    assert {res.tasks[t].state for t in ("worker:0", "worker:2")} == {TaskState.STOPPED}
    assert rec.kinds("protocol_error")[0].task == "worker:1"
    assert backend.nodes["worker:1"].chan.closed  # its node stops the task when the channel closes


def test_out_of_order_and_impersonation_are_protocol_errors():
    def spawned_before_go(n: FakeNode) -> None:
        n.hello()
        n.send(p.Spawned(pid=5))
        n.idle(5)

    res, _, _ = supervise({"worker:0": spawned_before_go}, n_hosts=2)
    assert res.root_cause.kind == "protocol" and "'spawned' before the go" in res.root_cause.message
    assert res.state == JobState.START_FAILED  # before the go: nothing ran (exit code 4)

    def claims_another_task(n: FakeNode) -> None:
        n.raw(p.MARKER)
        n.send(p.Hello(pid=9, remote_dir="/x", task=p.TaskRef("worker", 0)))
        n.idle(5)

    res, _, _ = supervise({"worker:1": claims_another_task}, n_hosts=2)
    assert res.root_cause.kind == "protocol" and "claims worker:0" in res.root_cause.message


def test_an_oversized_frame_is_refused_without_buffering_it():
    def flood(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.raw(p.HEADER.pack(p.T_LOG, 1, 3 << 30))  # claims a 3 GiB frame
        n.raw(b"x" * (1 << 20))
        n.idle(5)

    res, _, _ = supervise({"worker:0": flood}, n_hosts=2)
    assert res.root_cause.kind == "protocol" and "oversized frame" in res.root_cause.message


def test_an_interrupt_forwards_sigint_and_ends_interrupted():
    interrupt = Interrupt()

    def started(n: FakeNode) -> None:
        obedient(n)

    timer = threading.Timer(0.6, interrupt.trigger, args=(signal.SIGINT,))
    timer.start()
    try:
        res, rec, backend = supervise({}, n_hosts=2, interrupt=interrupt)
    finally:
        timer.cancel()
    assert res.state == JobState.INTERRUPTED_SIGINT
    assert all(
        next(c for c in n.received if isinstance(c, p.Stop)).signal == signal.SIGINT for n in backend.nodes.values()
    )
    assert rec.kinds("interrupted")[0].signal == "SIGINT"


def test_status_reports_examples_per_second_from_progress_records():
    def trains(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=5))
        stopped(n, n.run_until_stopped(beats=0.05, steps=10))

    loaded, plan = make_plan(1)
    backend = FakeBackend({"worker:0": trains})
    rec = Recorder()
    sup = Supervisor(
        loaded.spec,
        plan,
        backend,
        attempt=0,
        bus=EventBus([rec]),
        logs=rec,
        heartbeats=rec,
        interrupt=Interrupt(),
        clock=backend.clock,
    )
    seen = []

    def watch(status):
        seen.append(status["tasks"]["worker:0"])
        if status["tasks"]["worker:0"]["examples_per_s"]:
            sup.interrupt.trigger(signal.SIGTERM)

    sup.on_status = watch
    try:
        sup.run()
    finally:
        backend.close()
    rates = [s["examples_per_s"] for s in seen if s["examples_per_s"]]
    assert rates and 1000 < rates[0] < 20000  # 320 examples per 0.05 s heartbeat ≈ 6400/s


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


def exit_code_for_state(state: JobState) -> int:
    from orchestrator.cli.exitcodes import STATE_EXIT_CODES

    return STATE_EXIT_CODES[state]


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
