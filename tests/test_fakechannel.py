"""The unit tier's fake channel holds descriptors as a real channel does: none is left open, none closed twice."""

from __future__ import annotations

import gc
import os

from fakechannel import FakeChannel


def _fds() -> set[int]:
    gc.collect()
    return set(map(int, os.listdir("/proc/self/fd")))


def test_a_channel_closed_by_the_launcher_before_its_node_hung_up_leaves_nothing_open():
    """The launcher closes a channel it stopped reading (a teardown); the node hangs up later: the four
    pipe ends are closed (the launcher's at its close, the node's at its hang-up), and a write after the
    close is lost, as on a closed socket, not an error in the node's thread."""
    before = _fds()
    chan = FakeChannel()
    chan.write(b"a line\n")
    chan.close()
    assert chan.filenos() == [] and chan.read() == (b"", b"", True)
    chan.write(b"after the close\n")
    chan.hang_up(0)
    assert _fds() <= before


def test_a_channel_dropped_without_a_hang_up_is_closed_at_collection():
    before = _fds()
    chan = FakeChannel()
    chan.write(b"x\n")
    del chan
    assert _fds() <= before


def test_a_number_closed_is_never_written_again():
    """After the node's ends are closed, a write goes nowhere, even where the number now names another
    pipe's write end (numbers are reused at once)."""
    chan = FakeChannel()
    w = chan._w
    r, w2 = os.pipe()  # before the channel's close: other numbers
    chan.end_output()
    os.dup2(w2, w)  # the number the channel wrote to is now this pipe's write end
    os.set_blocking(r, False)
    try:
        chan.write(b"must not land in the new pipe\n")
        try:
            got = os.read(r, 100)
        except BlockingIOError:
            got = b""
        assert got == b""
    finally:
        for fd in (r, w2, w):
            os.close(fd)
        chan.close()
