"""What a task had already sent when the launcher gave up on it is moot, not a protocol error.

At 4,096 tasks a launcher behind its reads was stopped (SIGTERM) and gave up on tasks at the teardown
deadline (STOPPED, no exit heard); the heartbeats they had sent before that were read afterwards (the
pump's leftovers, handled once the loop has ended) and each was judged "out of order: 'heartbeat' after
it stopped": the run's root cause became a protocol error instead of the interruption. The fake tier
(real pump, queue, sessions and supervisor); the leftover is handed to the supervisor as its loop's
end hands it (``Supervisor._handle``).
"""

from __future__ import annotations

import signal

from fakenode import FakeBackend, FakeNode, make_plan, obedient
from supervising import Recorder, build_supervisor

from orchestrator.core.states import JobState, TaskState
from orchestrator.supervise.inputs import Received
from worker_entry import protocol as p


def _run(scripts, box: list | None = None):
    """One attempt over 2 fake nodes; ``box`` gets the supervisor before it runs (a script may use it)."""
    loaded, plan = make_plan(2)
    backend = FakeBackend(scripts)
    rec = Recorder()
    sup = build_supervisor(loaded, plan, backend, rec)
    if box is not None:
        box.append(sup)
    try:
        res = sup.run()
    finally:
        backend.close()
    return sup, res, rec


def _beat() -> Received:
    return Received("worker:1", p.msg_frame(p.Heartbeat(seq=99, ts=1.0, state="running")), b"", False)


def test_a_heartbeat_read_after_the_launcher_gave_up_on_its_task_is_no_protocol_error():
    """worker:1 ignores the SIGTERM's stop and is given up on at the teardown deadline; a heartbeat of
    it handled after that (a leftover of the pump) is moot: no protocol error, no failure, still
    interrupted."""

    box: list = []

    def deaf(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=11))
        n.send(p.Started(how="strategy"))
        box[0].interrupt.trigger(signal.SIGTERM)
        n.run_until_stopped()  # the stop: ignored
        while not n.eof:  # beats on until the launcher gives up on it
            n.heartbeat(state="running")
            n.next_command(0.05)
            n.clock.advance(1.0)

    sup, res, _ = _run({"worker:0": obedient, "worker:1": deaf}, box)
    s = sup.sessions["worker:1"]
    assert s.state == TaskState.STOPPED and s.exit is None, (s.state, s.exit)  # given up on, as at scale
    assert res.state == JobState.INTERRUPTED_SIGTERM
    sup._handle(_beat())  # what the loop's end does with the pump's leftovers
    assert not sup.failures, sup.failures  # (the bus is closed by now: the failures are the record)


def test_a_message_after_the_task_said_it_exited_is_still_a_protocol_error():
    """The moot rule is for what the launcher gave up on: a node that said it exited and talks on
    breaks the protocol, as before."""

    def quits(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=12))
        n.exited(1)  # fails: the job is torn down and ends
        n.idle(5)

    sup, _, _ = _run({"worker:1": quits})
    assert sup.sessions["worker:1"].exit is not None
    before = list(sup.failures)
    sup._handle(_beat())
    late = sup.failures[len(before) :]
    assert [f.kind for f in late] == ["protocol"] and "'heartbeat' after it failed" in late[0].message, late
