"""The supervisor over an in-process fake node: no sshd, no TensorFlow, real protocol.

Teardown order, root-cause choice, the startup deadline, lost/hung verdicts and protocol violations,
interrupts and progress in status, through the real pump, decoder, sessions and supervisor. The job
around it (result.json, unreachable hosts, restarts, closed channels) is in test_supervisor_job.py.
"""

from __future__ import annotations

import signal
import threading

import pytest
from fakenode import FakeBackend, FakeNode, healthy, make_plan, obedient, stopped
from supervising import Recorder, build_supervisor, exit_code_for_state, supervise
from waiting import wait_for

from orchestrator.core.states import JobState, TaskState
from orchestrator.supervise import Interrupt
from worker_entry import protocol as p


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


def test_startup_deadline_blames_a_task_that_never_dialed_before_one_slow_to_say_hello():
    """worker:2's host never answers (its start stays pending); worker:0's node is up but slow to say
    hello (python starting on a loaded host). worker:2 is the root cause, though worker:0 comes first."""
    rec, unblock = Recorder(), threading.Event()

    class HostDown(FakeBackend):
        def start(self, node, config):
            if str(node.task) == "worker:2":
                unblock.wait(30)  # connecting, until the test is over
                raise OSError("connection timed out")
            return super().start(node, config)

    def slow_hello(n: FakeNode) -> None:
        wait_for(lambda: len(rec.kinds("task_ready")) == 1, 10, "worker:1's hello")
        n.clock.advance(6.0)  # past job.startup_timeout_s, before its own hello
        n.idle(10)

    try:
        res, rec, _ = supervise({"worker:0": slow_hello}, rec=rec, backend_cls=HostDown, job={"startup_timeout_s": 5})
    finally:
        unblock.set()
    rc = res.root_cause
    assert (rc.kind, rc.task) == ("startup_timeout", "worker:2"), rc
    assert "on worker:2, worker:0" in rc.message


def test_startup_deadline_blames_the_idle_task_not_a_busy_one_still_starting():
    """On a loaded box a healthy task may still be importing TensorFlow at the startup deadline. Both it
    (worker:0, first in plan order) and the task that never starts (worker:2) have dialed, said hello
    and beat; only worker:0's process keeps a CPU busy. worker:2 is the root cause."""

    def slow(n: FakeNode) -> None:  # on its way to a TF server, busy on the CPU
        n.hello()
        if isinstance(n.wait_for(p.Go), p.Go):
            n.send(p.Spawned(pid=5))
            stopped(n, n.run_until_stopped(cpu_pct=90.0))

    def asleep(n: FakeNode) -> None:  # never gets there; moves the supervisor's clock past the deadline
        n.hello()
        if not isinstance(n.wait_for(p.Go), p.Go):
            return
        n.send(p.Spawned(pid=7))
        stop = None
        for _ in range(40):  # 10 s in 0.25 s steps, beating: past job.startup_timeout_s (5), never silent
            n.heartbeat(state="sleeping", cpu_pct=0.0)
            while (cmd := n.next_command(0.01)) is not None and not isinstance(cmd, p.Stop):
                pass  # pings
            if (stop := cmd) is not None or n.eof:
                break
            n.let_pass(0.25)
        stopped(n, stop)

    res, rec, _ = supervise({"worker:0": slow, "worker:2": asleep}, job={"startup_timeout_s": 5})
    rc = res.root_cause
    assert (rc.kind, rc.task, rc.host) == ("startup_timeout", "worker:2", "10.0.0.3")
    assert rc.message.startswith("worker:2 did not start within 5s")
    assert "worker:0 had not started either but kept a CPU busy" in rc.message
    (verdict,) = rec.kinds("startup_timeout")
    assert verdict.task == "worker:2" and verdict.not_started == ["worker:2", "worker:0"]


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
    sup = build_supervisor(loaded, plan, backend, rec)
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
