"""The chief's checkpoint at the end of a succeeded run (issue h29), unit tier over fake nodes speaking the
real protocol: a chief that ended long before the last worker is kept waiting for its hand-over by the
launcher's pings (its node gives up on a silent launcher after ``launcher_timeout_s``), and a chief whose
node closed its channel before the hand-over is never passed over in silence: result.json says why."""

from __future__ import annotations

import json
import time

from fakenode import FakeBackend, FakeChannel, FakeNode, healthy, make_plan
from localconn import LocalConnection

from orchestrator.core.states import JobState, TaskState
from orchestrator.job import Job, LaunchOptions
from orchestrator.schedulers.ssh import SCHEDULER
from orchestrator.supervise.pings import Pings
from orchestrator.supervise.session import TaskSession
from worker_entry import protocol as p

HEARTBEAT = {"interval_s": 0.1, "timeout_s": 2.0, "progress_timeout_s": None}  # the node's patience: 1 s


def _task_files(n: FakeNode) -> p.TaskFiles:
    ckpt = n.config.checkpoint_dir
    assert ckpt, "the chief is told its checkpoint directory (checkpoint.gather)"
    return p.TaskFiles(task_dir=p.Manifest(root="/tmp/x", exists=True), checkpoint=p.Manifest(root=ckpt, exists=True))


def _serve_like_a_node(n: FakeNode) -> None:
    """What worker_entry's hand-over does: serve until bye or EOF, or give up after its patience
    (``launcher_timeout_s``) of silence from the launcher; every command counts as a word."""
    patience = n.config.launcher_timeout_s
    while True:
        cmd = n.next_command(patience)
        if cmd is None or isinstance(cmd, p.Bye):
            return


def _chief(closes_at_once: bool = False):
    def script(n: FakeNode) -> None:
        healthy(0.2)(n)
        n.send(_task_files(n))
        if not closes_at_once:
            _serve_like_a_node(n)

    return script


def _worker(after_s: float):
    """Ends ``after_s`` seconds of the node's patience after the chief (4: well after the chief's node
    would have given up on a silent launcher)."""

    def script(n: FakeNode) -> None:
        healthy(0.2 + after_s * n.config.launcher_timeout_s)(n)
        n.send(p.TaskFiles(task_dir=p.Manifest(root="/tmp/x", exists=True)))
        _serve_like_a_node(n)

    return script


class _Reachable(FakeBackend):
    """Its chief's node answers helper commands too (the SSH fleet): this machine with its own HOME."""

    def __init__(self, scripts, home) -> None:
        super().__init__(scripts)
        self.home = home

    def connection(self, task: str) -> LocalConnection | None:
        return LocalConnection(self.home) if task == "worker:0" else None


def _job(tmp_path, chief, home=None, after_s=0.0):
    loaded, plan = make_plan(2, ssh={"config_file": None}, heartbeat=HEARTBEAT)
    scripts = {"worker:0": chief, "worker:1": _worker(after_s)}
    backend = FakeBackend(scripts) if home is None else _Reachable(scripts, home)
    opts = LaunchOptions(run_dir=str(tmp_path / "r"), gather=True, live=False, echo_logs=False)
    result = Job(loaded, plan, opts, backend, scheduling=SCHEDULER.scheduling(loaded, plan)).run()
    return result, backend


def test_a_chief_that_ended_first_is_kept_waiting_by_pings_and_its_checkpoint_is_handed_over(tmp_path):
    result, backend = _job(tmp_path, _chief(), after_s=4.0)
    assert result.state == JobState.SUCCEEDED
    chief = backend.nodes["worker:0"]
    assert chief.config.launcher_timeout_s == 1.0
    # pinged while it waited for its hand-over, and told bye at the end (not left to give up on us)
    assert sum(isinstance(m, p.Ping) for m in chief.received[-20:]) >= 3
    assert isinstance(chief.received[-1], p.Bye)
    ckpt = result.gather["checkpoints"]
    assert ckpt == {"gathered": True, "task": "worker:0", "source": f"10.0.0.1:{chief.config.checkpoint_dir}"}
    assert result.gather["errors"] == []


def test_a_chief_whose_channel_closed_before_the_hand_over_is_reported_not_passed_over(tmp_path):
    result, _ = _job(tmp_path, _chief(closes_at_once=True), after_s=1.0)  # its EOF read first
    assert result.state == JobState.SUCCEEDED
    ckpt = result.gather["checkpoints"]
    why = "its node closed the channel after the task ended, before the hand-over"
    assert ckpt["gathered"] is False and ckpt["task"] == "worker:0" and ckpt["not_handed_over"] == why
    (error,) = [e for e in result.gather["errors"] if "checkpoint" in e]
    assert error.startswith(f"worker:0: checkpoint not gathered ({why}; no connection to fetch it over)")
    assert "tfcluster gather RUN" in error
    assert result.gather["logs"]["worker:0"] == "not handed over: its node closed the channel after the task ended"


def test_an_ended_task_is_pinged_while_it_hands_over_and_no_longer_once_closed():
    _, plan = make_plan(1)
    s = TaskSession(plan.nodes[0])
    chan = FakeChannel()
    s.attach(chan)
    s.exit = p.Exited(code=0, ended=time.time())
    s.become(TaskState.SUCCEEDED)
    pings = Pings([s.task], 1.0, now=0.0)
    assert pings.tick(1.0, {s.task: s}) == 1
    assert s.send(p.Bye())
    sent = [chan.inbox.get_nowait() for _ in range(2)]
    assert [p.parse_command(line.strip()).TYPE for line in sent] == ["ping", "bye"]
    s.close()
    assert pings.tick(2.0, {s.task: s}) == 0 and not s.send(p.Bye())


def test_a_chief_not_handed_over_has_its_checkpoint_fetched_over_a_helper_connection(tmp_path):
    home = tmp_path / "chief-home"
    ckpt = home / ".tfcluster" / "runs" / "fake-run" / "checkpoints"  # the plan's ~/... on that node
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "ckpt-6"\n')
    (ckpt / "sub" / "ckpt-6.index").write_bytes(b"\x01" * 300)
    result, _ = _job(tmp_path, _chief(closes_at_once=True), home=home, after_s=1.0)
    assert result.state == JobState.SUCCEEDED
    got = tmp_path / "r" / "checkpoints"
    assert (got / "checkpoint").read_text() == 'model_checkpoint_path: "ckpt-6"\n'
    assert (got / "sub" / "ckpt-6.index").read_bytes() == b"\x01" * 300
    summary = result.gather["checkpoints"]
    assert summary["gathered"] is True and summary["task"] == "worker:0"
    assert summary["not_handed_over"] == "its node closed the channel after the task ended, before the hand-over"
    assert result.gather["errors"] == [] and result.gather["files"] == 2
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    (warning,) = [e for e in events if e["event"] == "warning" and "checkpoint" in e["message"]]
    assert warning["task"] == "worker:0" and "fetched over a new connection" in warning["message"]
