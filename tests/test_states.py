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


def test_job_states_change_through_one_table_outcomes_only_as_the_policy_reads_them():
    from orchestrator.core.states import InvalidJobTransition, JobState, advance

    live = [s for s in JobState if not s.is_terminal]
    outcomes = [s for s in JobState if s.is_terminal]
    assert JobState.REQUEUED in live and JobState.SUCCEEDED in outcomes
    for o in outcomes:  # nothing goes back from an outcome to a phase (REQUEUED: the policy's reading)
        assert not any(o.can_become(s) for s in live if s != JobState.REQUEUED), o
    assert advance(JobState.STARTING, JobState.RUNNING) == JobState.RUNNING
    assert advance(JobState.RUNNING, JobState.RUNNING) == JobState.RUNNING  # no change
    with pytest.raises(InvalidJobTransition, match="succeeded -> running"):
        advance(JobState.SUCCEEDED, JobState.RUNNING)
    with pytest.raises(InvalidJobTransition, match="connect_failed -> starting"):
        advance(JobState.CONNECT_FAILED, JobState.STARTING)
    with pytest.raises(InvalidJobTransition, match="running -> restarting"):
        advance(JobState.RUNNING, JobState.RESTARTING)  # an attempt never restarts; its run does


def test_a_run_and_an_attempt_refuse_a_job_transition_outside_the_table():
    from orchestrator.core.result import AttemptResult, RunResult
    from orchestrator.core.states import InvalidJobTransition, JobState

    run = RunResult("j", "r", "/r", JobState.CONNECTING, 0.0, 0.0)
    run.become(JobState.STARTING)
    run.become(JobState.RESTARTING)
    with pytest.raises(InvalidJobTransition, match="restarting -> succeeded"):
        run.become(JobState.SUCCEEDED)  # a run between attempts has no outcome until its next attempt
    assert run.state == JobState.RESTARTING
    attempt = AttemptResult(0, JobState.INTERRUPTED_SIGTERM, 0.0, 1.0, {})
    attempt.become(JobState.REQUEUED)  # the allocation ended under it
    with pytest.raises(InvalidJobTransition, match="requeued -> succeeded"):
        attempt.become(JobState.SUCCEEDED)


def test_a_live_state_is_refused_at_the_cli_edge_and_a_requeued_batch_step_exits_0():
    from orchestrator.cli.exitcodes import EXIT_OK, LiveStateError, exit_code_for_state

    assert exit_code_for_state("requeued") == EXIT_OK
    for live in ("connecting", "starting", "running", "stopping", "restarting"):
        with pytest.raises(LiveStateError, match=f"still '{live}'"):
            exit_code_for_state(live)
