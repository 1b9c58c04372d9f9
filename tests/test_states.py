"""Task states change through one table: forward only, terminal is final, reported once."""

from __future__ import annotations

import pytest
from fakenode import make_plan

from orchestrator.core.states import TaskState
from orchestrator.supervise.session import InvalidTransition, TaskSession


def test_a_terminal_state_is_final_and_every_live_state_can_end():
    terminal = [s for s in TaskState if s.is_terminal]
    for t in terminal:
        assert not any(t.can_become(o) for o in TaskState)
    for s in (TaskState.STARTING, TaskState.READY, TaskState.RUNNING, TaskState.STOPPING):
        assert all(s.can_become(t) for t in terminal)
    assert not TaskState.RUNNING.can_become(TaskState.READY)  # forward only
    assert not TaskState.PENDING.can_become(TaskState.RUNNING)  # never run without a channel and a hello


def test_a_session_reports_its_end_once_and_refuses_a_transition_the_table_does_not_allow():
    _, plan = make_plan(1)
    ended = []
    s = TaskSession(plan.nodes[0], on_terminal=ended.append)
    s.become(TaskState.STARTING)
    s.become(TaskState.READY)
    s.become(TaskState.READY)  # no change: nothing to report
    s.become(TaskState.LOST)
    assert ended == ["worker:0"]
    with pytest.raises(InvalidTransition, match="lost -> running"):
        s.become(TaskState.RUNNING)
    assert s.state == TaskState.LOST and ended == ["worker:0"]
