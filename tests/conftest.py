"""Shared helpers: run the real launcher (`python -m orchestrator`) against a real test bed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from waiting import wait_for

pytest_plugins = ["testbed_fixtures", "slurm_fixtures", "shared_runs"]

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "tests" / "workloads"
PY = sys.executable

# A suite started in the background of a non-interactive shell (``cmd &``) inherits SIGINT ignored, and
# every launcher it starts with it: the tests that press Ctrl-C then waited in vain (a clean-clone run
# started that way failed the two Slurm Ctrl-C tests). A Python handler is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _private_state(tmp_path_factory, monkeypatch):
    """The launcher's private state (Kubernetes ownership records) of each test in a directory of its
    own, never the real ~/.local/state (subprocesses started with ``_env()`` inherit it)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["NO_COLOR"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


@dataclass
class Launched:
    rc: int
    stdout: str
    stderr: str
    run_dir: Path
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "result.json").read_text())

    @property
    def events(self) -> list[dict[str, Any]]:
        return read_events(self.run_dir)

    def log(self, slug: str, attempt: int = 0) -> str:
        name = f"{slug}.log" if attempt == 0 else f"{slug}.attempt-{attempt}.log"
        return (self.run_dir / "logs" / name).read_text()


def repo_python(directory: Path) -> str:
    """An interpreter for ``job.python`` that runs this checkout's ``worker_entry`` on the nodes: the
    nodes start ``PYTHON -m worker_entry`` from the login directory, where an editable install of
    another checkout would win. A wrapper script that puts REPO first on PYTHONPATH."""
    path = directory / "python-this-repo"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {PY} "$@"\n')
    path.chmod(0o755)
    return str(path)


def training_pid(tb, host) -> int | None:
    """PID of the ``keras_synthetic`` training process on a test-bed host (not its worker_entry)."""
    for p in tb.host_processes(host):
        try:
            if "keras_synthetic" in " ".join(p.cmdline()) and "worker_entry" not in p.cmdline()[1:3]:
                return p.pid
        except Exception:
            continue
    return None


def backed_up_epochs(backup_dir: Path) -> int:
    """How many epochs the chief's BackupAndRestore backup holds: tf_keras saves one checkpoint per
    epoch (``ckpt-N`` after epoch N of the first attempt) into ``backup_dir/chief`` and names it in the
    ``checkpoint`` state file, which TensorFlow writes atomically after the checkpoint's files."""
    try:
        state = (backup_dir / "chief" / "checkpoint").read_text()
    except OSError:
        return 0
    m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.M)
    return int(m.group(1)) if m else 0


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a .jsonl file a live run may be appending to: its complete lines only (the last
    one may be half-written as we read); a complete line that is not JSON still fails the test."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return jsonl(run_dir / "events.jsonl")


def launch_argv(tb, spec: Path, run_dir: Path, *extra: str) -> list[str]:
    return tb.launcher_argv([PY, "-m", "orchestrator", "launch", str(spec), "--run-dir", str(run_dir), *extra])


def start_launch(tb, spec: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        launch_argv(tb, spec, run_dir, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=str(REPO),
    )


def run_launch(tb, spec: Path, run_dir: Path, *extra: str, timeout: float = 300) -> Launched:
    t0 = time.monotonic()
    p = start_launch(tb, spec, run_dir, *extra)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        raise AssertionError(
            f"launcher did not finish within {timeout}s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        ) from None
    return Launched(p.returncode, out, err, run_dir, time.monotonic() - t0)


def run_cli(*args: str, timeout: float = 120, tb=None, **kw: Any) -> subprocess.CompletedProcess:
    argv = [PY, "-m", "orchestrator", *args]
    if tb is not None:
        argv = tb.launcher_argv(argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=str(REPO), **kw)


def host_pids(tb) -> dict[str, list[int]]:
    return {name: [p.pid for p in procs] for name, procs in tb.processes_by_host().items()}


def job_processes(tb) -> dict[str, list[str]]:
    """Processes of the job on each host: everything but sshd's own (a per-connection sshd on a cut
    host lives until TCP gives up; it is the host's, not ours)."""
    out: dict[str, list[str]] = {}
    for name, procs in tb.processes_by_host().items():
        for p in procs:
            try:
                if p.status() == psutil.STATUS_ZOMBIE or p.name() == "sshd":
                    continue
                out.setdefault(name, []).append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                continue
    return out


def no_processes_on_hosts(tb) -> bool:
    return not job_processes(tb)


def assert_no_job_processes(tb, timeout: float = 5.0) -> None:
    """Wait until no job process is left on any host; fail listing them."""
    left: dict[str, list[str]] = {}

    def gone() -> bool:
        left.clear()
        left.update(job_processes(tb))
        return not left

    wait_for(gone, timeout, lambda: f"no job process left on the hosts (left: {left})")


@pytest.fixture
def launcher_env() -> dict[str, str]:
    return _env()


@pytest.fixture(scope="session", autouse=True)
def nodes_run_this_checkout(tmp_path_factory) -> Any:
    """Test-bed specs (also those a launcher subprocess builds, e.g. `tfcluster demo`) run this
    checkout's worker_entry on the hosts, whatever another checkout's editable install says."""
    from tfcluster_testbed.spec import PYTHON_ENV

    saved = os.environ.get(PYTHON_ENV)
    os.environ[PYTHON_ENV] = repo_python(tmp_path_factory.mktemp("python"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PYTHON_ENV, None)
        else:
            os.environ[PYTHON_ENV] = saved
