"""Whatever a node sends, the launcher's memory for it is bounded (issue 10.1)."""

from __future__ import annotations

import contextlib
import os
import time

from fakenode import FakeChannel, make_plan
from waiting import wait_for

from orchestrator.supervise.inputs import ChannelPump, InputQueue
from orchestrator.supervise.session import DIAG_BYTES, TAIL_BYTES, TaskSession
from worker_entry import protocol as p


def _session() -> TaskSession:
    _, plan = make_plan(1)
    s = TaskSession(plan.nodes[0])
    s.attach(FakeChannel())
    return s


def test_worker_entry_stderr_and_the_output_tail_are_bounded():
    s = _session()
    for _ in range(200):
        s.receive(b"", b"e" * 100_000 + b"\n")  # 20 MB of worker_entry stderr
    assert len(s.diag_text) <= DIAG_BYTES
    s.receive(p.MARKER, b"")
    for i in range(2000):
        s.receive(p.log_frame(1, f"line {i} ".encode() + b"x" * 1000 + b"\n"), b"")
    assert sum(len(x) for x in s._tail) <= TAIL_BYTES + 2000
    assert s.last_lines()[-1].startswith("line 1999")


def test_a_login_shell_that_never_stops_talking_is_bounded():
    s = _session()
    for _ in range(100):
        s.receive(b"x" * 100_000, b"")  # no marker, ever
    assert s.decoder.pending < len(p.MARKER) and len(s.decoder.preamble) == 0  # reported, then dropped


def test_nothing_is_decoded_after_a_protocol_error():
    s = _session()
    items = s.receive(p.MARKER + p.HEADER.pack(9, 9, 9), b"")
    assert [type(i).__name__ for i in items] == ["Violation"]
    assert s.receive(p.log_frame(1, b"more\n") * 1000, b"") == []
    assert s.decoder.pending == 0


def test_the_pump_stops_reading_when_the_supervisor_falls_behind():
    """Back-pressure: a full queue stops the pump, so the channel (then the node) holds the rest."""
    chan = FakeChannel()
    os.set_blocking(chan._w, False)
    q = InputQueue(maxsize=2)
    pump = ChannelPump(q)
    pump.start()
    pump.add("worker:0", chan)
    try:

        def queue_filled() -> bool:
            """Feed the channel until the pump has filled its queue, however late it gets to run: a pipe
            found full before then says only that the pump has not read yet."""
            with contextlib.suppress(BlockingIOError):
                os.write(chan._w, b"y" * 65536)
            return q.qsize() >= 2

        wait_for(queue_filled, 20, "the pump to fill its queue", interval=0.01)
        assert q.qsize() == 2
        full_since: list[float] = []

        def stays_full() -> bool:
            """The pipe is full and stays full (no room made for a write 0.2 s later): nobody reads it."""
            try:
                os.write(chan._w, b"y" * 65536)
            except BlockingIOError:
                full_since[:] = full_since or [time.monotonic()]
                return time.monotonic() - full_since[0] >= 0.2
            full_since.clear()  # maybe the pump just had not read yet
            return False

        wait_for(stays_full, 20, "the channel to stay full: the pump to stop reading", interval=0.05)
        assert q.qsize() == 2
    finally:
        pump.stop()
        while not q.empty():
            q.get_nowait()
        pump.join(5)
        chan.close()
