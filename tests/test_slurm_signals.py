"""Slurm without a Slurm: how the supervisor reads a signal (an ending allocation against a stop), and
teardown's last resort for an srun still running or a step left on Slurm's books by a dead node."""

from __future__ import annotations

import signal

import pytest
from slurm_specs import slurm_job, spec_text

from orchestrator.schedulers.slurm import commands as sc
from orchestrator.schedulers.slurm.commands import JobInfo
from orchestrator.schedulers.slurm.follow import ask_cancel_or_detach
from orchestrator.schedulers.slurm.plan import slurm_plan, srun_argv
from orchestrator.schedulers.slurm.state import SlurmState, request_stop
from orchestrator.spec import load_spec_text

# ----------------------------------------------------------------------------- the supervisor's view of a signal


@pytest.mark.parametrize(
    ("first", "info", "stop", "expect"),
    [
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="1:55"), None, "timeout"),
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="5:00:00"), None, "preempted"),
        (signal.SIGUSR2, JobInfo("9", "UNKNOWN"), None, "timeout"),
        (signal.SIGTERM, JobInfo("9", "COMPLETING"), None, "preempted"),
        (signal.SIGTERM, JobInfo("9", "CANCELLED"), None, None),
        (signal.SIGTERM, JobInfo("9", "RUNNING"), "SIGTERM", None),
        (signal.SIGINT, JobInfo("9", "RUNNING"), None, None),
    ],
)
def test_the_supervisor_tells_an_ending_allocation_from_a_stop(tmp_path, monkeypatch, first, info, stop, expect):
    _ending(tmp_path, monkeypatch, first, info, stop, expect, batch=True)


@pytest.mark.parametrize(
    ("first", "info", "expect"),
    [
        (signal.SIGTERM, JobInfo("9", "RUNNING"), None),
        (signal.SIGTERM, JobInfo("9", "COMPLETING"), "preempted"),
        (signal.SIGUSR2, JobInfo("9", "RUNNING", time_left="1:00"), "timeout"),
    ],
)
def test_inside_the_users_allocation_a_sigterm_while_it_runs_is_a_stop(tmp_path, monkeypatch, first, info, expect):
    _ending(tmp_path, monkeypatch, first, info, None, expect, batch=False)


def _ending(tmp_path, monkeypatch, first, info, stop, expect, batch):
    loaded = load_spec_text(spec_text())
    monkeypatch.setattr(sc, "job_info", lambda job, env=None: info)
    job, run, scheduling = slurm_job(
        tmp_path, loaded, SlurmState(run_id="sl-1"), batch=batch, env={"SLURM_JOB_ID": "9"}
    )
    if stop:
        request_stop(run, stop, "test")
    job.interrupt.trigger(first)
    job.interrupt.trigger(signal.SIGTERM)  # Slurm's SIGTERM after our USR2 does not change the reason
    assert scheduling.allocation_ending(job.interrupt) == expect
    job.bus.close()


def test_ctrl_c_asks_only_on_a_terminal():
    class Pipe:
        def isatty(self) -> bool:
            return False

    assert ask_cancel_or_detach(Pipe()) == "c"


# ----------------------------------------------------------------------------- teardown's last resort


def test_srun_still_running_after_the_teardown_gets_its_step_scancelled_then_killed(tmp_path, monkeypatch):
    import subprocess

    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    backend = st.SlurmStepBackend(spec, slurm_plan(spec, run_id="x"), log_dir=tmp_path, env={"SLURM_JOB_ID": "7"})
    calls = []
    monkeypatch.setattr(st, "SRUN_EXIT_WAIT_S", 0.1)
    monkeypatch.setattr(st, "SCANCEL_WAIT_S", 0.3)
    monkeypatch.setattr(sc, "steps_named", lambda job, name: calls.append(("steps", job, name)) or ["7.0"])
    monkeypatch.setattr(sc, "cancel", lambda target, **kw: calls.append(("scancel", target, kw)))
    backend.srun = subprocess.Popen(["sleep", "60"])  # an srun that does not end by itself
    backend.step_name = "sl-a0"
    backend.close()
    assert calls == [("steps", "7", "sl-a0"), ("scancel", "7.0", {"signal": "KILL"})]
    assert backend.srun.poll() is not None  # and killed when even that did not end it
    assert any("scancel --signal=KILL 7.0" in n for n in backend.notes) and any("killed" in n for n in backend.notes)


class _StuckSrun:
    """An srun that never ends by itself (its step has a node that cannot report): the waits it is given."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.killed = False

    def poll(self):
        return -9 if self.killed else None

    def wait(self, timeout=None):
        import subprocess

        if self.killed:
            return -9
        self.waits.append(timeout)
        raise subprocess.TimeoutExpired("srun", timeout)

    def kill(self) -> None:
        self.killed = True


def test_a_step_with_a_node_known_dead_is_scancelled_at_once_not_after_the_full_grace(tmp_path, monkeypatch):
    """The previous step's node n2 left the job for good (the next step runs without it: its task was
    judged lost for a host reason), or Slurm says n2 does not respond: srun would wait for a slurmstepd
    that cannot report, so the step is scancelled at once (in the background: scancel itself blocks while
    Slurm tries the dead node) and srun gets 1 s, not 5 + 10 s. A step whose nodes are all alive keeps
    the full grace."""
    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    cancelled: list[str] = []
    monkeypatch.setattr(sc, "steps_named", lambda job, name: ["7.0"] if name == "sl-a0" else [])
    monkeypatch.setattr(sc, "cancel", lambda target, **kw: cancelled.append(target))
    sinfo = {"out": "n1|mix\nn2|mix\n"}
    monkeypatch.setattr(sc, "run", lambda argv, **kw: sinfo["out"] if argv[0] == "sinfo" else "")

    def ended(left=(), sinfo_out="n1|mix\nn2|mix\n") -> tuple[list[float], list[str]]:
        sinfo["out"] = sinfo_out
        backend = st.SlurmStepBackend(spec, slurm_plan(spec, run_id="x"), log_dir=tmp_path, env=env)
        backend.srun, backend.step_name, backend._step_hosts = _StuckSrun(), "sl-a0", ("n1", "n2")
        srun = backend.srun
        backend._end_step(left=left)
        assert srun.killed
        backend.close()  # reaps a scancel left in the background
        assert cancelled.pop() == "7.0" and not any(t.is_alive() for t in backend._cancels)
        return srun.waits, backend.notes

    waits, notes = ended(left=["n2"])  # left the job for good: not even the quick wait
    assert waits == [st.DEAD_NODE_SCANCEL_WAIT_S]
    assert "srun was still running after the teardown (node n2 known dead: its srun cannot report)" in notes[0]
    waits, notes = ended(sinfo_out="n1|mix\nn2|mix*\n")  # Slurm: n2 not responding
    assert waits == [st.SRUN_QUICK_EXIT_S, st.DEAD_NODE_SCANCEL_WAIT_S] and "node n2 known dead" in notes[0]
    waits, notes = ended()  # every node alive: the full grace, as before
    assert waits == [st.SRUN_QUICK_EXIT_S, st.SRUN_EXIT_WAIT_S - st.SRUN_QUICK_EXIT_S, st.SCANCEL_WAIT_S]
    assert "known dead" not in notes[0]


def test_a_step_left_on_slurms_books_by_a_dead_node_is_overlapped_not_waited_for(tmp_path, monkeypatch):
    """A node that stopped answering keeps the previous attempt's step on Slurm's books (until it is
    marked DOWN): the next step would wait for that step's CPUs ("Requested nodes are busy"), so it is
    started with --overlap, and the run is told why. A step that ended normally changes nothing."""
    import subprocess

    from orchestrator.schedulers.slurm import step as st

    spec = load_spec_text(spec_text()).spec
    plan = slurm_plan(spec, run_id="x")
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(argv, **kw):
        started.append(list(argv))
        return real_popen(["true"], **kw)

    monkeypatch.setattr(st.subprocess, "Popen", popen)
    monkeypatch.setattr(sc, "node_addrs", lambda nodelist: "")
    starts = [(n, n.node_config(1)) for n in plan.nodes]
    for books, overlap in ((["7.0"], True), ([], False)):
        monkeypatch.setattr(sc, "steps_named", lambda job, name, books=books: list(books) if name == "sl-a0" else [])
        backend = st.SlurmStepBackend(spec, plan, log_dir=tmp_path, env=env)
        backend.step_name = "sl-a0"  # the previous attempt's step (its srun is gone)
        backend.launch(starts)
        assert ("--overlap" in started[-1]) is overlap, started[-1]
        assert any("7.0" in n and "--overlap" in n for n in backend.notes) is overlap, backend.notes
        backend.close()
    assert srun_argv(spec, plan.nodes[0].argv, attempt=1, overlap=True)[-5] == "--overlap"
    assert "--overlap" not in srun_argv(spec, plan.nodes[0].argv, attempt=1)
