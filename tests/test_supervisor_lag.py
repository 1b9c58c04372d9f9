"""A launcher slow to read is not a silent node: silence is judged up to what the launcher has read.

At 4,096 tasks on 2 cores a task was judged lost during the start ("no heartbeat for 10.3 s") while its
heartbeats waited unread behind thousands of other tasks' handshakes. The supervisor now judges a
task's silence up to ``inputs.read_horizon``: the pump's progress and the oldest item still queued.
The fake tier (real pump, queue, sessions and supervisor; ``tests/fakenode.py``) and the horizon alone.
"""

from __future__ import annotations

import os
import threading

from fakenode import FakeNode
from supervising import Recorder, supervise
from waiting import wait_for

from orchestrator.core.states import JobState
from orchestrator.supervise.inputs import ChannelPump, InputQueue, Received, read_horizon
from worker_entry import protocol as p


def test_tasks_whose_heartbeats_wait_unread_past_the_timeout_are_not_lost():
    """The pump stuck in one read for 1.5 s of the supervisor's time (timeout 1.0 s): every node keeps
    beating, nothing is read, the loop keeps ticking; no task is lost, and the job succeeds."""
    rec = Recorder()
    stuck, release, done = threading.Event(), threading.Event(), threading.Event()
    pings_after: list[int] = []

    def beats_until_done(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=10 + n.node.task.index))
        n.send(p.Started(how="strategy"))
        n.beating = True
        while not done.is_set():
            n.heartbeat(state="running")
            cmd = n.next_command(0.05)
            if isinstance(cmd, p.Ping) and pings_after:
                pings_after[0] += 1
        n.beating = False
        n.exited(0)

    def stalls_the_pump(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=10))
        n.send(p.Started(how="strategy"))
        wait_for(lambda: {t for t, _ in rec.beats} >= {"worker:1", "worker:2"}, 10, "every peer beating")
        real_read = n.chan.read

        def stuck_read() -> tuple[bytes, bytes, bool]:
            stuck.set()
            release.wait(20)
            n.chan.read = real_read
            return real_read()

        n.chan.read = stuck_read
        n.heartbeat(state="running")  # wakes the pump, which now stays in this read
        wait_for(stuck.is_set, 10, "the pump inside worker:0's read")
        pings_after.append(0)
        n.clock.advance(1.5)  # the supervisor's time passes heartbeat.timeout_s (1.0) while it reads nothing
        # two pings to a peer after the jump: the loop has ticked (pings, then the verdicts) with it at least once
        wait_for(lambda: pings_after[0] >= 2, 10, "the loop to tick past the timeout while the pump is stuck")
        release.set()
        n.beating = True
        for _ in range(5):  # read again: the peers' waiting heartbeats and these are taken in
            n.heartbeat(state="running")
            n.next_command(0.05)
        n.beating = False
        done.set()
        n.exited(0)

    scripts = {"worker:0": stalls_the_pump, "worker:1": beats_until_done, "worker:2": beats_until_done}
    res, rec, _ = supervise(scripts, rec=rec)
    assert not rec.kinds("worker_lost"), [e.message for e in rec.kinds("worker_lost")]
    assert res.state == JobState.SUCCEEDED, res.root_cause


class _Pump:
    """What ``read_horizon`` reads of the pump: waiting idle in select, how far it has read, and since
    when it has been inside one channel's read (None: it is not)."""

    def __init__(self, idle: bool, read_through: float, reading_since: float | None = None) -> None:
        self.idle = idle
        self.read_through = read_through
        self.reading_since = reading_since


def test_the_horizon_is_now_when_nothing_waits_and_else_the_oldest_unread():
    t = [100.0]
    q = InputQueue(clock=lambda: t[0])
    assert read_horizon(105.0, _Pump(True, 90.0), q, 10.0) == 105.0  # idle, nothing queued: caught up
    assert read_horizon(105.0, _Pump(False, 103.0), q, 10.0) == 103.0  # reading: up to its last pass
    q.put(Received("worker:0", b"x", b"", False))
    t[0] = 104.0
    q.put(Received("worker:1", b"y", b"", False))
    assert q.oldest() == 100.0
    assert read_horizon(105.0, _Pump(True, 90.0), q, 10.0) == 100.0  # queued since 100: not handled yet
    q.get_nowait()
    assert read_horizon(105.0, _Pump(True, 90.0), q, 10.0) == 104.0
    q.get_nowait()
    assert q.oldest() is None


def test_the_launcher_forgives_its_own_lag_but_not_a_read_that_hangs():
    """A loop or a pump behind by 49 s: forgiven (a dead task is found that much later, not never); a
    pump inside one read for longer than ``stuck_s`` cannot hide the others' deaths for ever."""
    q = InputQueue(clock=lambda: 0.0)
    assert read_horizon(50.0, _Pump(False, 1.0), q, 30.0) == 1.0
    assert read_horizon(50.0, _Pump(False, 1.0, reading_since=45.0), q, 30.0) == 1.0
    assert read_horizon(50.0, _Pump(False, 1.0, reading_since=5.0), q, 30.0) == 20.0
    q.put(Received("worker:0", b"x", b"", False))  # queued at 0.0: the loop's own lag, forgiven
    assert read_horizon(50.0, _Pump(True, 1.0), q, 30.0) == 0.0


def test_the_loop_drains_what_is_there_under_one_lock_in_order():
    t = [0.0]
    q = InputQueue(maxsize=3, clock=lambda: t[0])
    for i in range(3):
        t[0] = float(i)
        q.put(Received(f"worker:{i}", b"x" * 10, b"", False))
    assert q.full()
    got = q.get_many(2)
    assert [r.task for r in got] == ["worker:0", "worker:1"]
    assert q.oldest() == 2.0 and q.bytes == 10 and not q.full()  # room again: a waiting put goes on
    assert [r.task for r in q.get_many(256)] == ["worker:2"]
    assert q.get_many(256) == [] and q.oldest() is None and q.bytes == 0


class _PipeChannel:
    """A channel over a pipe (the node writes, the pump reads): counts the pump's reads."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.reads = 0

    def filenos(self) -> list[int]:
        return [self.r]

    def read(self) -> tuple[bytes, bytes, bool]:
        self.reads += 1
        try:
            return os.read(self.r, 1 << 16), b"", False
        except BlockingIOError:
            return b"", b"", False

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


def test_bytes_held_in_a_pass_behind_a_full_queue_are_not_silence():
    """4,096 tasks on 2 cores: a pump pass held back by a full queue for longer than the heartbeat
    timeout. Node A's heartbeat arrived at 3 and waits in the queue at 20, unhandled; A was last handled
    at 2. The horizon must stay at or before 3 (its bytes are the launcher's backlog, not A's silence):
    the queue once stamped them with their put (20), and an idle pump made the horizon 20, A "lost"."""
    t = [0.0]
    q = InputQueue(maxsize=1, clock=lambda: t[0])
    pump = ChannelPump(q, clock=lambda: t[0])
    a, b = _PipeChannel(), _PipeChannel()
    pump.add("A", a)  # type: ignore[arg-type]
    pump.add("B", b)  # type: ignore[arg-type]
    pump.start()
    try:
        os.write(a.w, b"a1")
        wait_for(q.full, 10, "A's first heartbeat queued")
        t[0] = 1.0
        os.write(b.w, b"b1")
        wait_for(lambda: b.reads >= 1, 10, "B read, its put held back by the full queue")
        t[0] = 2.0
        assert q.get(timeout=5).out == b"a1"  # A handled at 2
        wait_for(q.full, 10, "B's heartbeat queued")
        t[0] = 3.0
        os.write(a.w, b"a2")  # A's next heartbeat arrives at 3
        wait_for(lambda: a.reads >= 2, 10, "A read again, its put held back by B")
        t[0] = 20.0
        assert q.get(timeout=5).out == b"b1"
        wait_for(lambda: pump.idle and q.qsize() == 1, 10, "A's second heartbeat queued, the pump idle")
        assert read_horizon(20.0, pump, q, 30.0) <= 3.0
        assert q.get(timeout=5).out == b"a2"
        wait_for(lambda: q.oldest() is None, 5, "the queue drained")
        assert read_horizon(20.0, pump, q, 30.0) == 20.0  # caught up and idle: now
    finally:
        pump.stop()
        pump.join(5)
        a.close()
        b.close()
