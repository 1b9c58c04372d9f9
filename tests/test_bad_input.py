"""Bad input on the command line and in the run directory: a clear message naming the file or option,
a non-zero exit code, no traceback, in bounded time; run-directory files private whatever the umask."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fakenode import FakeBackend, healthy, make_plan

from orchestrator.cli.main import main
from orchestrator.job import Job, LaunchOptions

REPO = Path(__file__).resolve().parent.parent
SSH_SPEC = "version: 1\nname: x\nhosts:\n  - {address: 127.0.0.2}\njob:\n  command: [python, t.py]\n"
K8S_SPEC = REPO / "cluster_specs" / "k8s-jobset.yaml"


def cli(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        stdin=stdin,
        timeout=60,  # a guard against a hang (validate /dev/zero used to read forever), not a measurement
    )


def clean(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "afile"
    f.write_text("not a directory\n")
    return f


def test_launch_run_dir_that_is_a_file(tmp_path, a_file):
    spec = tmp_path / "s.yaml"
    spec.write_text(SSH_SPEC)
    r = cli("launch", str(spec), "--run-dir", str(a_file), "--no-preflight")
    clean(r)
    assert r.returncode == 2, r.stderr
    assert f"--run-dir {a_file}: exists and is not a directory" in r.stderr
    assert a_file.read_text() == "not a directory\n"


def test_launch_run_dir_under_a_file(tmp_path, a_file):
    spec = tmp_path / "s.yaml"
    spec.write_text(SSH_SPEC)
    r = cli("launch", str(spec), "--run-dir", str(a_file / "run"), "--no-preflight")
    clean(r)
    assert r.returncode == 2 and f"--run-dir {a_file / 'run'}: {a_file} is not a directory" in r.stderr, r.stderr


def test_scale_run_dir_that_is_a_file(tmp_path, a_file):
    spec = tmp_path / "s.yaml"
    spec.write_text(SSH_SPEC)
    r = cli("scale", str(spec), "--workers", "1", "--run-dir", str(a_file))
    clean(r)
    assert r.returncode == 2 and f"--run-dir {a_file}: exists and is not a directory" in r.stderr, r.stderr


def test_render_output_that_is_a_file(a_file):
    r = cli("render", str(K8S_SPEC), "-o", str(a_file))
    clean(r)
    assert r.returncode == 2 and f"-o {a_file}: exists and is not a directory" in r.stderr, r.stderr


def test_render_output_files_are_private(tmp_path):
    out = tmp_path / "manifests"
    old = os.umask(0o022)
    try:
        r = cli("render", str(K8S_SPEC), "-o", str(out))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    (written,) = out.iterdir()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


def test_validate_of_a_device_is_refused_at_once():
    r = cli("validate", "/dev/zero")
    clean(r)
    assert r.returncode == 2 and "/dev/zero: spec: is a character device, expected a cluster spec file" in r.stderr


def test_validate_of_an_endless_pipe_stops_at_the_cap():
    zeros = subprocess.Popen(["cat", "/dev/zero"], stdout=subprocess.PIPE)
    try:
        r = cli("validate", "/dev/stdin", stdin=zeros.stdout.fileno())
    finally:
        zeros.kill()
        zeros.wait()
        zeros.stdout.close()
    clean(r)
    assert r.returncode == 2 and "a cluster spec is at most" in r.stderr, r.stderr


def test_validate_of_a_pipe_still_works():
    with open(REPO / "cluster_specs" / "loopback-3.yaml", "rb") as f:
        proc = subprocess.run(["cat"], stdin=f, capture_output=True, timeout=30)
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "/dev/stdin"],
        input=proc.stdout,
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def test_validate_of_a_spec_with_a_nul_character(tmp_path):
    spec = tmp_path / "nul.yaml"
    spec.write_bytes(SSH_SPEC.replace("name: x", "name: x\x00y").encode())
    r = cli("validate", str(spec))
    clean(r)
    assert r.returncode == 2
    assert f"{spec}:2: spec: contains the character U+0000 (NUL), which YAML does not allow" in r.stderr


def test_run_directory_files_are_private_whatever_the_umask(tmp_path):
    loaded, plan = make_plan(2)
    old = os.umask(0o022)
    try:
        backend = FakeBackend({"worker:0": healthy(0.1), "worker:1": healthy(0.1)})
        opts = LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False)
        Job(loaded, plan, opts, backend).run()
    finally:
        os.umask(old)
    run = tmp_path / "run"
    modes = {str(p.relative_to(run)): stat.S_IMODE(p.stat().st_mode) for p in run.rglob("*")}
    assert {"events.jsonl", "combined.log", "heartbeats.jsonl", "logs/worker-0.log"} <= set(modes)
    loose = {name: oct(m) for name, m in modes.items() if m & 0o077}
    assert not loose, loose


# --- another user's run --------------------------------------------------------------------------

NOBODY = 65534


@pytest.fixture
def shared_runs():
    """A world-readable runs/ (pytest's tmp_path is private to root) holding root's private run of job
    `secret` and a readable run of job `open`."""
    base = Path(tempfile.mkdtemp(prefix="tfc-shared-"))
    os.chmod(base, 0o755)
    runs = base / "runs"
    for name, job, mode in (("secret-20250101T000000Z", "secret", 0o700), ("open-20250101T000000Z", "open", 0o755)):
        d = runs / name
        d.mkdir(parents=True)
        (d / "plan.json").write_text(json.dumps({"job": job, "scheduler": "ssh", "run_id": name}))
        os.chmod(d / "plan.json", 0o644)
        os.chmod(d, mode)
    os.chmod(runs, 0o755)
    yield runs
    shutil.rmtree(base)


def as_nobody(argv: list[str]) -> tuple[int, str]:
    """``tfcluster ARGV`` in a forked child running as nobody (the interpreter's own files under /root
    are not nobody's to read, so the command runs once as root first to import what it needs)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    import pwd  # noqa: F401 - imported here, for the child that cannot read the interpreter's files

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main(argv)
            os.write(w, err.getvalue().encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a run directory owned by another user")
def test_status_of_a_run_another_user_owns(shared_runs):
    run = shared_runs / "secret-20250101T000000Z"
    code, err = as_nobody(["status", str(run)])
    assert code == 2, err
    assert "belongs to root (uid 0) and is private to its owner" in err and "internal error" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a run directory owned by another user")
def test_a_private_run_in_a_shared_runs_dir_breaks_nobody_elses_status(shared_runs):
    code, err = as_nobody(["status", "open", "--runs-dir", str(shared_runs)])
    assert code == 0, err
    code, err = as_nobody(["status", "secret", "--runs-dir", str(shared_runs)])
    assert code == 2, err
    assert "no run of 'secret' that you can read" in err and "root (uid 0)" in err and "internal error" not in err
