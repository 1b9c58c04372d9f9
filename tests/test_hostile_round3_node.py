"""worker_entry's own defences, unit tier (issue 31): the safe task directory (item 7; its e2e over real
SSH is test_hostile_round3_scratch_e2e.py) and a worker's last steps (item 12)."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from orchestrator.supervise.figures import Figures
from worker_entry.agent.safedir import UnsafePath, open_dir, open_file
from worker_entry.instrument import progress

OTHER = 54321
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's files needs root")


@pytest.fixture
def scratch(tmp_path):
    d = tmp_path / "scratch"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def test_missing_components_are_made_private_and_the_last_is_ours(scratch):
    fd = open_dir(str(scratch / "a" / "b"))
    try:
        st = os.fstat(fd)
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
        assert (scratch / "a").stat().st_mode & 0o777 == 0o700
    finally:
        os.close(fd)


@root_only
def test_a_directory_of_another_user_on_the_path_is_refused(scratch):
    theirs = scratch / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(UnsafePath, match=f"{theirs} belongs to uid {OTHER}"):
        open_dir(str(theirs / "task"))
    assert not (theirs / "task").exists()


@root_only
def test_a_link_of_another_user_is_not_followed_but_ours_is(scratch, tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    planted = scratch / "planted"
    planted.symlink_to(target)
    os.chown(planted, OTHER, OTHER, follow_symlinks=False)
    with pytest.raises(UnsafePath, match="symbolic link made by uid 54321: not followed"):
        open_dir(str(planted / "task"))
    assert not (target / "task").exists()
    ours = scratch / "ours"
    ours.symlink_to(target)  # a link this user made (like /home -> /export/home) is followed
    os.close(open_dir(str(ours / "task")))
    assert (target / "task").is_dir()


def test_a_directory_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(UnsafePath, match=r"writable by others \(mode 0777\) without the sticky bit"):
        open_dir(str(loose / "task"))


def test_files_are_never_opened_through_a_link_in_the_directory(scratch, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    fd = open_dir(str(scratch / "task"))
    try:
        os.symlink(victim, "output.log", dir_fd=fd)
        with pytest.raises(OSError) as err:
            open_file(fd, "output.log")
        assert err.value.errno == errno.ELOOP
        os.symlink(victim, "exit.json.tmp", dir_fd=fd)
        os.close(open_file(fd, "exit.json.tmp", exclusive=True))  # the link is removed, a new file made
        assert os.stat("exit.json.tmp", dir_fd=fd, follow_symlinks=False).st_size == 0
    finally:
        os.close(fd)
    assert victim.read_text() == "precious\n"


# --- item 12: a worker's last steps ----------------------------------------------------------------


def test_steps_counted_after_an_epoch_reset_carry_their_own_time(monkeypatch):
    """The demo's 300 / 273 / 299: after the last epoch's reset, the step clock's final count went out
    with the time of the record before it, and the launcher took it for a repeat."""
    sent: list[dict] = []
    monkeypatch.setattr(progress, "emit", lambda kind, **f: sent.append(f) or True)
    c = progress.StepCounter("train", min_interval_s=0)
    c.add(10, source="stamps", at=100.0)  # opens the window
    c.add(271, source="stamps", at=101.0)
    c.reset_window()  # the Keras callback at the epoch's end
    c.add(19, source="stamps", at=102.0)  # the final poll at exit
    c.flush()
    assert [(r["steps"], r.get("ts")) for r in sent] == [(281, 101.0), (300, 102.0)]


def test_the_steps_made_are_the_most_any_record_said(tmp_path):
    figs = Figures()
    for seq, (ts, steps) in enumerate([(100.0, 10), (101.0, 281), (101.0, 300)], 1):
        figs.add("worker:0", {"seq": seq, "ts": ts + 1, "progress": {"steps": steps, "ts": ts, "phase": "train"}})
    assert figs.final()["worker:0"].steps == 300 and figs.live("worker:0").steps == 300
    json.dumps(figs.final()["worker:0"].to_dict())


# --- item 9: a host an hour ahead -------------------------------------------------------------------

HOUR = 3600.0


def _ahead(n):
    """A worker whose clock is an hour ahead: every time it sends is the launcher's plus an hour."""
    from fakenode import FakeNode  # noqa: F401 - the type of n

    from worker_entry import protocol as p

    n.hello(time=time.time() + HOUR)
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=5))
    n.send(p.Started(how="strategy"))
    steps = 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        steps += 5
        now = time.time() + HOUR
        n.seq += 1
        progress = p.Progress(steps=steps, examples=steps * 32, ts=now)
        n.send(p.Heartbeat(seq=n.seq, ts=now, state="running", progress=progress))
        if n.next_command(0.05) is not None and n.eof:
            return
    n.exited(0)


def _on_time(n):
    from worker_entry import protocol as p

    n.hello()
    n.wait_for(p.Go)
    n.send(p.Spawned(pid=5))
    n.send(p.Started(how="strategy"))
    steps = 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        steps += 5
        n.heartbeat(state="running", progress=p.Progress(steps=steps, examples=steps * 32, ts=time.time()))
        if n.next_command(0.05) is not None and n.eof:
            return
    n.exited(0)


def test_a_host_an_hour_ahead_keeps_the_whole_runs_figures(tmp_path):
    """The issue's case: with one host an hour off, every task's and the job's steps/s and examples/s
    were None in status, report, goodput and TensorBoard. Through the real Job (fake nodes)."""
    from fakenode import FakeBackend, make_plan

    from orchestrator.job import Job, LaunchOptions
    from orchestrator.runs import RunDir
    from orchestrator.views.report import build_report

    loaded, plan = make_plan(3, heartbeat={"interval_s": 0.1, "timeout_s": 5.0})
    backend = FakeBackend({"worker:0": _on_time, "worker:1": _ahead, "worker:2": _on_time})
    run = tmp_path / "run"
    result = Job(
        loaded, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), backend
    ).run()
    assert result.state.value == "succeeded", result.root_cause
    status = json.loads((run / "status.json").read_text())
    rates = {t: v["steps_per_s"] for t, v in status["tasks"].items()}
    assert all(r is not None and r > 10 for r in rates.values()), rates
    assert abs(rates["worker:1"] - rates["worker:0"]) < 0.5 * rates["worker:0"], rates
    assert status["throughput"]["steps_per_s"] is not None
    report = build_report(RunDir(run))
    assert report.to_dict()["throughput"]["steps_per_s"] == status["throughput"]["steps_per_s"]
    records = [json.loads(x) for x in (run / "heartbeats.jsonl").read_text().splitlines()]
    ahead = [r for r in records if r["task"] == "worker:1" and "progress" in r]
    assert ahead and all(abs(r["clock_skew_s"] - HOUR) < 5 for r in ahead)
    assert all(abs(r["ts"] - time.time()) < 120 for r in ahead)  # on the launcher's clock now
    events = (run / "events.jsonl").read_text()
    assert "clock is +3600" in events and "put on the launcher's clock" in events


def test_a_pods_own_empty_dir_is_not_a_shared_scratch(tmp_path):
    """The kubelet makes a pod's emptyDir mode 0777 (only the pod's containers see it): a pod's task
    directory there is used; the same directory on a host is refused."""
    from worker_entry.agent.taskdir import TaskDir

    empty_dir = tmp_path / "tfcluster"
    empty_dir.mkdir()
    os.chmod(empty_dir, 0o777)
    pod = TaskDir(str(empty_dir / "worker-0"), {}, pod=True)
    assert pod.problems == [] and pod.fd is not None
    os.close(pod.open_log())
    host = TaskDir(str(empty_dir / "worker-1"), {})
    assert host.fd is None and "without the sticky bit" in host.problems[0]["message"]
