"""One supervisor, many tasks: the load generator's nodes (real protocol, connect-back TCP, a separate
process) through a real Job, with every launcher descriptor numbered above 1024; the pump on such a
descriptor; the open-file limit; the summaries a large job shows.

The full-size figures (1,024 and 4,096 tasks, CPU, RSS, latencies) are bench/supervisor_scale.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import threading

import pytest
from conftest import jsonl
from fakenode import make_plan
from loadfleet import LoadGenBackend, run_job
from waiting import wait_for

from orchestrator.backends import limits
from orchestrator.backends.tcp import SocketChannel
from orchestrator.core.states import JobState
from orchestrator.sinks.live import LiveTable
from orchestrator.supervise.inputs import ChannelPump, InputQueue, Received
from orchestrator.supervise.summary import summarize, summary_lines
from orchestrator.views.control import status_text
from worker_entry.protocol.seal import Opener, Sealer

TASKS = 300


@contextlib.contextmanager
def descriptors_above(n: int):
    """Hold descriptors so that everything opened meanwhile is numbered above ``n``."""
    soft, _hard = limits.raise_nofile()
    if soft < n + 4 * TASKS + 256:
        pytest.skip(f"open-file limit {soft} is too low to place descriptors above {n}")
    held = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            held.append(fd)
            if fd >= n:
                break
        yield
    finally:
        for fd in held:
            os.close(fd)


def events(run_dir) -> list[dict]:
    return jsonl(run_dir / "events.jsonl")  # read live too: complete lines only


def test_hundreds_of_tasks_over_descriptors_above_1024_and_a_dead_one_tears_the_job_down(tmp_path):
    run_dir = tmp_path / "run"
    backend = None
    with descriptors_above(1100):
        probe = socket.socket()
        assert probe.fileno() > 1024  # everything the launcher opens from here on is above select()'s reach
        probe.close()
        backend = LoadGenBackend()
        killer = threading.Thread(target=kill_when_all_running, args=(backend, run_dir, 123), daemon=True)
        killer.start()
        result = run_job(TASKS, run_dir, backend, interval=0.5, timeout=10)
        killer.join(30)
    assert result.state == JobState.FAILED
    rc = result.root_cause
    assert (rc.task, rc.kind, rc.signal) == ("worker:123", "signal", "SIGKILL"), rc
    evs = events(run_dir)
    assert sum(1 for e in evs if e["event"] == "task_spawned") == TASKS
    assert [e["reason"] for e in evs if e["event"] == "teardown"] == ["worker:123 (node123): killed by SIGKILL"]
    states = {t.task: t.state.value for t in result.attempts[0].tasks.values()}
    assert states.pop("worker:123") == "failed"
    assert set(states.values()) == {"stopped"}, {s for s in states.values()}
    status = json.loads((run_dir / "status.json").read_text())
    assert len(status["tasks"]) == TASKS and status["finished"]
    assert backend.gen.proc.poll() is not None  # the generator ended with the job (closed channels)


def kill_when_all_running(backend: LoadGenBackend, run_dir, rank: int, timeout: float = 120) -> None:
    """Once every task of the job is running, the generator's ``rank`` dies of SIGKILL."""
    path = run_dir / "events.jsonl"
    wait_for(
        lambda: (
            backend.generators and path.exists() and sum(e["event"] == "task_spawned" for e in events(run_dir)) == TASKS
        ),
        timeout,
        f"all {TASKS} tasks spawned",
        interval=0.2,
    )
    backend.gen.cue("kill", rank)


def test_the_pump_reads_a_channel_on_a_descriptor_above_1024():
    out = InputQueue()
    pump = ChannelPump(out)
    pump.start()
    with descriptors_above(1100):
        a, b = socket.socketpair()
    try:
        assert a.fileno() > 1024
        key_in, key_out = bytes(range(32)), bytes(32)
        chan = SocketChannel(a, "peer", Sealer(key_out), Opener(key_in))
        pump.add("worker:0", chan)
        b.sendall(Sealer(key_in).seal(b"bytes"))  # what a node sends: sealed records
        got = out.get(timeout=5)
        assert isinstance(got, Received) and (got.task, got.out) == ("worker:0", b"bytes")
        b.close()
        assert out.get(timeout=5).eof
    finally:
        pump.stop()
        pump.join(5)
        a.close()
    assert not pump.is_alive()


def test_a_hard_limit_too_low_for_the_job_is_said(monkeypatch):
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: (1024, 1024))
    monkeypatch.setattr(limits.resource, "setrlimit", lambda *_: None)
    assert limits.nofile_warning(100) is None
    text = limits.nofile_warning(1000)  # SSH: 3 a channel, a log file and an event file while open
    assert "the open-file limit is 1024 (hard limit 1024)" in text and "4576 descriptors" in text
    assert "ulimit -Hn 4576" in text
    # nodes that dial back: a socket each; the logs and event files open at once are bounded, so 16,384
    # tasks fit under this box's 20,000 (they did not while every task's log and event file stayed open)
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: (20000, 20000))
    assert limits.needed(16384, per_task=1) == 64 + 16384 + limits.OPEN_LOGS + limits.OPEN_EVENT_FILES <= 20000
    assert limits.nofile_warning(16384, per_task=1) is None and "ulimit" in limits.nofile_warning(16384)


def test_the_soft_limit_goes_up_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert limits.raise_nofile() == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def big_status(n: int) -> dict:
    tasks = {
        f"worker:{i}": {
            "host": f"n{i}",
            "state": "running",
            "step_time_s": 0.05 + i / 1e5,
            "last_heartbeat_age_s": 0.4,
            "straggler": i == 17,
        }
        for i in range(n)
    }
    tasks["worker:5"].update(state="lost", last_heartbeat_age_s=12.0)
    return {"job": "big", "state": "running", "run_dir": "/nonexistent", "tasks": tasks}


def test_status_of_a_thousand_tasks_is_a_summary_and_all_of_them_with_all():
    st = big_status(1000)
    s = summarize(st["tasks"])
    assert s.states == {"running": 999, "lost": 1}
    assert [name for name, _ in s.slowest][:2] == ["worker:999", "worker:998"]
    assert s.fastest[0][0] == "worker:0" and s.stragglers == ["worker:17"] and s.bad == [("worker:5", "lost")]
    assert s.silent == [("worker:5", 12.0)]

    class Handle:
        def scheduler_lines(self, st):
            return []

        def detail_lines(self, st):
            return []

    text = status_text(st, Handle())
    assert len(text.splitlines()) < 15
    assert "1000 tasks: 999 running, 1 lost" in text and "stragglers: worker:17" in text
    assert "worker:5 (lost)" in text and "--all" in text
    full = status_text(st, Handle(), show_all=True)
    assert len(full.splitlines()) > 1000


def test_the_live_table_of_a_large_job_is_its_summary():
    _, plan = make_plan(40)
    rendered = LiveTable(plan)._render(big_status(40))
    assert "40 tasks: 39 running, 1 lost" in rendered.plain
    assert summary_lines(summarize(big_status(40)["tasks"]))[0] in rendered.plain


def test_nodes_waiting_for_the_go_spread_their_heartbeats_at_thousands_of_tasks():
    """At 4,096 tasks the nodes' waiting heartbeats were ~108k records of the start, half the launcher's
    work before every task ran: past 512 tasks a waiting node beats less often (at most half the
    timeout apart); at 3 tasks, exactly as before."""
    from orchestrator.plan.model import WAITING_HEARTBEATS_PER_S, Runtime
    from tfcluster_testbed.loadgen.node import LoadNode
    from worker_entry import protocol as p

    rt = Runtime(job="j", heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0)
    assert [rt.waiting_heartbeat_s(n) for n in (3, 512, 1024, 4096)] == [1.0, 1.0, 2.0, 5.0]
    assert Runtime(job="j", heartbeat_timeout_s=30.0).waiting_heartbeat_s(4096) == 4096 / WAITING_HEARTBEATS_PER_S
    _, plan = make_plan(3)  # 0.1 s heartbeats: a small job's nodes beat at the interval while waiting
    assert {n.node_config(0).waiting_heartbeat_s for n in plan.nodes} == {0.1}
    _, big = make_plan(1024)  # 1 s timeout: at most half of it
    assert big.nodes[7].node_config(0).waiting_heartbeat_s == 0.5
    # the load generator's node, as worker_entry's: the waiting interval until the go, then the interval
    config = p.NodeConfig(argv=["t"], remote_dir="/r", heartbeat_interval_s=1.0, waiting_heartbeat_s=4.0)
    node = LoadNode(0, config, now=0.0)
    node.start()
    beats = lambda t0, t1: sum(bool(node.due(t / 10)) for t in range(int(t0 * 10), int(t1 * 10)))  # noqa: E731
    assert beats(0, 10) == 3  # at 0, 4 and 8 s
    node.feed(b'{"type": "go"}\n', 10.0)
    assert beats(10, 20) == 10  # one a second once running
