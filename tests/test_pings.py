"""The launcher's pings (``supervise.pings``): every live task once a period, spread round-robin over
the loop's ticks, a third of the node's patience apart (never more often than a heartbeat interval)."""

from __future__ import annotations

from orchestrator.core.states import TaskState
from orchestrator.supervise.pings import Pings, ping_period
from worker_entry import protocol as p


class _Session:
    def __init__(self, state: TaskState = TaskState.RUNNING) -> None:
        self.state = state
        self.handing_over = False  # an ended task still handing over is pinged too (test_handover_chief)
        self.sent: list[p.Message] = []

    def send(self, m: p.Message) -> bool:
        self.sent.append(m)
        return True


def test_the_period_is_a_third_of_the_nodes_patience_and_at_least_an_interval():
    assert ping_period(1.0, 9.0) == 3.0  # the defaults: heartbeat 1 s, timeout 10 s -> the node waits 9 s
    assert ping_period(1.0, 2.0) == 1.0  # a short timeout: every interval, as before
    assert ping_period(0.1, 0.2) == 0.1


def test_every_live_task_is_pinged_once_a_period_a_share_at_each_tick():
    sessions = {f"worker:{i}": _Session() for i in range(300)}
    sessions["worker:7"].state = TaskState.SUCCEEDED
    pings = Pings(list(sessions), 3.0, now=0.0)
    per_tick = [pings.tick(t / 10, sessions) for t in range(1, 31)]  # 3 s of 0.1 s ticks
    assert max(per_tick) <= 11  # 300 tasks over 30 ticks: ~10 a tick, never one burst of 300
    assert [len(s.sent) for n, s in sessions.items() if n != "worker:7"] == [1] * 299
    assert sessions["worker:7"].sent == []
    assert all(isinstance(m, p.Ping) for s in sessions.values() for m in s.sent)


def test_a_loop_that_stalled_catches_up_with_one_round_at_most():
    sessions = {f"worker:{i}": _Session() for i in range(50)}
    pings = Pings(list(sessions), 3.0, now=0.0)
    assert pings.tick(30.0, sessions) == 50  # ten periods late: each task once, not ten times
    assert pings.tick(30.1, sessions) <= 2


def test_a_ping_goes_out_as_the_same_line_encoded_once():
    sessions = {"worker:0": _Session()}
    Pings(list(sessions), 1.0, 0.0).tick(1.0, sessions)  # type: ignore[arg-type]
    (ping,) = sessions["worker:0"].sent
    assert p.command_line(ping) == p.command_line(p.Ping()) == b'{"type":"ping"}\n'
