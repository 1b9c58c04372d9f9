"""Secrets stay out of what tfcluster prints and stores; `stop` signals only a tfcluster launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from fakenode import FakeBackend, healthy, make_plan

from orchestrator.core.errors import UsageError
from orchestrator.core.redact import redact_argv, redact_env, secret_values
from orchestrator.job import Job, LaunchOptions
from orchestrator.runs import RunDir
from orchestrator.schedulers import scheduler_named
from orchestrator.views.control import stop_job


def test_names_urls_and_flags_are_redacted():
    env = {
        "DB_PASSWORD": "hunter2",
        "SESSION_COOKIE": "c",
        "AWS_SECRET_ACCESS_KEY": "k",
        "SENTRY_DSN": "d",
        "HF_TOKEN": "t",
        "MLFLOW_URI": "https://alice:s3cr3t@mlflow.example/x",
        "NCCL_DEBUG": "WARN",
    }
    red = redact_env(env)
    assert {k for k, v in red.items() if v == "<redacted>"} == {
        "DB_PASSWORD",
        "SESSION_COOKIE",
        "AWS_SECRET_ACCESS_KEY",
        "SENTRY_DSN",
        "HF_TOKEN",
    }
    assert red["MLFLOW_URI"] == "https://alice:<redacted>@mlflow.example/x" and red["NCCL_DEBUG"] == "WARN"
    argv = [
        "python",
        "t.py",
        "--token",
        "abc123",
        "--api-key=xyz",
        "-p",
        "3",
        "--db",
        "postgres://u:pw9@h/d",
        "--lr",
        "1",
    ]
    assert redact_argv(argv) == [
        "python",
        "t.py",
        "--token",
        "<redacted>",
        "--api-key=<redacted>",
        "-p",
        "3",
        "--db",
        "postgres://u:<redacted>@h/d",
        "--lr",
        "1",
    ]
    assert set(secret_values({"A_TOKEN": "tok"}, argv)) == {"tok", "abc123", "xyz", "pw9"}


def test_names_short_flags_url_users_and_shell_snippets_are_redacted():
    env = {
        "GITHUB_PAT": "pat-1111",
        "PRIVATE_SSH": "ssh-2222",
        "DB_PW": "pw-3333",
        "PYTHONPATH": "/src",
        "PATH": "/usr/bin",
        "REPO": "https://ghp_0123456789abcdefghijKLMN@github.com/o/r.git",
        "MIRROR": "ssh://git@github.com/o/r.git",
        "CONN": "Server=db;Password=odbc-4444;Database=x",
    }
    red = redact_env(env)
    assert {k for k, v in red.items() if v == "<redacted>"} == {"GITHUB_PAT", "PRIVATE_SSH", "DB_PW"}
    assert red["PYTHONPATH"] == "/src" and red["PATH"] == "/usr/bin" and red["MIRROR"] == env["MIRROR"]
    assert red["REPO"] == "https://<redacted>@github.com/o/r.git"
    assert red["CONN"] == "Server=db;Password=<redacted>;Database=x"
    assert redact_argv(["mysql", "-p", "hunter2", "-P", "3306"]) == ["mysql", "-p", "<redacted>", "-P", "3306"]
    assert redact_argv(["ssh", "-p", "2222", "h"]) == ["ssh", "-p", "2222", "h"]  # a port stays
    snippet = (
        "export DB_PASSWORD=sh-5555; git clone https://tok-6666@github.com/o/r && "
        "python t.py --token tk-7777 --lr 1 && curl -H 'Authorization: Bearer br-8888' https://x && "
        'sh -c "python u.py --api-key=ak-9999 -p pp-0000"'
    )
    shown = redact_argv(["bash", "-c", snippet])
    for secret in ("sh-5555", "tok-6666", "tk-7777", "br-8888", "ak-9999", "pp-0000"):
        assert secret not in shown[2], (secret, shown)
        assert secret in secret_values({}, ["bash", "-c", snippet])
    assert shown[:2] == ["bash", "-c"] and "--lr 1" in shown[2] and "python t.py --token <redacted>" in shown[2]
    assert redact_argv(["bash", "-c", "echo " + "a" * 20 + " ghp_0123456789abcdefghijKLMN"])[2].endswith("<redacted>")


SPEC_ENV = {"env": {"WANDB_API_KEY": "wandb-0123456789", "URL": "s3://me:pa55word@bucket/x"}}
COMMAND = ["python", "train.py", "--hf-token", "hf_abcdefgh", "--epochs", "3"]


def test_the_run_directory_never_holds_a_secret(tmp_path, monkeypatch):
    loaded, plan = make_plan(2, job={**SPEC_ENV, "command": COMMAND})
    monkeypatch.setattr(sys, "argv", ["tfcluster", "launch", "s.yaml", "--", *COMMAND])
    backend = FakeBackend({"worker:0": healthy(0.1), "worker:1": healthy(0.1)})
    Job(
        loaded, plan, LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False), backend
    ).run()
    run = tmp_path / "run"
    stored = "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())
    for secret in ("wandb-0123456789", "pa55word", "hf_abcdefgh"):
        assert secret not in stored, secret
    assert "<redacted>" in (run / "spec.yaml").read_text()
    assert json.loads((run / "launcher.json").read_text())["argv"][-3] == "<redacted>"
    shown = scheduler_named("ssh").describe(plan)
    assert "hf_abcdefgh" not in shown and "wandb-0123456789" not in shown and "--epochs 3" in shown
    # the nodes get the real values
    config = plan.nodes[0].node_config(0)
    assert "hf_abcdefgh" in config.argv and config.env["WANDB_API_KEY"] == "wandb-0123456789"


def test_the_run_directory_never_holds_a_secret_from_a_shell_snippet(tmp_path, monkeypatch):
    command = [
        "bash",
        "-c",
        "export DB_PASSWORD=sh-55555; mysql -p my-66666 && git clone https://tok-77777@github.com/o/r",
    ]
    loaded, plan = make_plan(
        2, job={"env": {"GITHUB_PAT": "pat-88888", "PRIVATE_SSH": "ssh-99999"}, "command": command}
    )
    monkeypatch.setattr(sys, "argv", ["tfcluster", "launch", "s.yaml", "--", *command])
    backend = FakeBackend({"worker:0": healthy(0.1), "worker:1": healthy(0.1)})
    Job(
        loaded, plan, LaunchOptions(run_dir=str(tmp_path / "run"), gather=False, live=False, echo_logs=False), backend
    ).run()
    stored = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file())
    for secret in ("sh-55555", "my-66666", "tok-77777", "pat-88888", "ssh-99999"):
        assert secret not in stored, secret
    shown = scheduler_named("ssh").describe(plan)
    assert not any(s in shown for s in ("sh-55555", "my-66666", "tok-77777", "pat-88888")) and "git clone" in shown


@pytest.fixture
def bystander():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _run_pointing_at(tmp_path, proc) -> RunDir:
    run = RunDir.create(tmp_path / "run")
    (run.plan_json).write_text("{}")
    info = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}
    run.launcher_json.write_text(json.dumps(info))
    return run


def test_stop_refuses_a_process_that_is_not_a_tfcluster_launcher(tmp_path, bystander):
    run = _run_pointing_at(tmp_path, bystander)
    with pytest.raises(UsageError, match="not a tfcluster launcher"):
        stop_job(run, timeout_s=1)
    time.sleep(0.2)
    assert bystander.poll() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a run directory owned by another user")
def test_stop_as_root_signals_only_the_run_directory_owners_launcher(tmp_path, bystander):
    run = _run_pointing_at(tmp_path, bystander)
    os.chown(run.path, 65534, 65534)  # nobody's run directory, naming root's process
    with pytest.raises(UsageError, match="belongs to uid 0, the run directory to uid 65534"):
        stop_job(run, timeout_s=1)
    assert bystander.poll() is None


def test_a_forged_pid_is_not_signalled(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.plan_json.write_text("{}")
    run.launcher_json.write_text(json.dumps({"pid": "1; reboot"}))
    assert "not running" in stop_job(run, timeout_s=1)
