"""Hostile specs and arguments met by validate, plan and the renderers (a review's findings): a login
name that would be an ssh option inside a ProxyCommand, credentials in directory URLs, a run id with a
newline, sbatch's abbreviated options, terminal escapes in a spec's own keys, a task count past what
plans, an ssh config or key that is a FIFO, non-finite seconds, a strategy of the wrong type."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

SECRET = "CKPTSECRET12"
SSH = yaml.safe_load((REPO / "cluster_specs" / "loopback-3.yaml").read_text())
SLURM = yaml.safe_load((REPO / "cluster_specs" / "slurm-2x4.yaml").read_text())


def _spec(tmp_path: Path, base: dict, **sections) -> Path:
    doc = json.loads(json.dumps(base))
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _refused(r, *words: str) -> None:
    assert r.returncode == 2 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_a_login_name_that_would_be_an_ssh_option_is_refused(tmp_path):
    hosts = [{**SSH["hosts"][0], "user": "-oProxyCommand=touch /tmp/PWNED #"}, *SSH["hosts"][1:]]
    _refused(run_cli("validate", str(_spec(tmp_path, SSH, hosts=hosts)), timeout=60), "hosts[0].user", "login name")
    _refused(run_cli("validate", str(_spec(tmp_path, SSH, ssh={"user": "a b"})), timeout=60), "ssh.user")
    for ok in ("alice", "svc_train.01", "user@CORP.EXAMPLE", "machine$"):
        assert run_cli("validate", str(_spec(tmp_path, SSH, ssh={"user": ok})), timeout=60).returncode == 0, ok
    from orchestrator.core.errors import UsageError
    from orchestrator.schedulers.ssh.targets import expand_tokens

    with pytest.raises(UsageError, match="starts with '-'"):  # whatever the value's source (a config's User)
        expand_tokens("ssh %r@bastion nc %h %p", hostname="h1", original="h1", port=22, user="-oX=y", local_user="me")


def test_credentials_in_directory_urls_are_redacted_everywhere(tmp_path):
    spec = _spec(
        tmp_path,
        SLURM,
        checkpoint={"dir": f"s3://AKIAEXAMPLE:{SECRET}@bucket/ckpt"},
        restart={"backup_dir": "/b/TOKEN=BACKUPSECRET13"},
        job={"workdir": "https://user:WORKDIRPASS5@example.com/w"},
        tensorboard={"dir": "/tb/password=TBSECRET77"},
    )
    secrets = (SECRET, "BACKUPSECRET13", "WORKDIRPASS5")
    for argv in (("plan", str(spec)), ("plan", str(spec), "--json"), ("plan", str(spec), "--task", "worker:0")):
        r = run_cli(*argv, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not [s for s in secrets if s in r.stdout], (argv, r.stdout[:3000])
    from orchestrator.spec import load_spec
    from orchestrator.spec.redact import redacted_text

    copy = redacted_text(load_spec(str(spec)))
    assert not [s for s in (*secrets, "TBSECRET77") if s in copy], copy


def test_a_run_id_is_a_safe_path_component(tmp_path):
    spec = _spec(tmp_path, SLURM)
    for bad in ("x\ntouch /tmp/PWNED #", "../../etc", "-x", "a b"):
        _refused(run_cli("plan", str(spec), "--json", f"--run-id={bad}", timeout=60), "--run-id", "a run id is")
    assert run_cli("plan", str(spec), "--json", "--run-id", "nightly-2026.11_28", timeout=60).returncode == 0
    from orchestrator.core.errors import UsageError
    from orchestrator.schedulers.slurm.plan import batch_script

    with pytest.raises(UsageError):
        batch_script("python3", "/runs/r", "r\ntouch /tmp/PWNED")


@pytest.mark.parametrize(
    "arg",
    [
        "--outp=/home/v/.bashrc",
        "--expo=NONE",
        "--comm=tfcluster:other",
        "--job-na=x",
        "--wra=id",
        "--open-mode=truncate",
    ],
)
def test_sbatch_abbreviations_of_options_tfcluster_sets_are_refused(tmp_path, arg):
    spec = _spec(tmp_path, SLURM, slurm={"extra_args": [arg]})
    _refused(run_cli("validate", str(spec), timeout=60), "slurm.extra_args")


def test_terminal_escapes_in_a_specs_own_keys_do_not_reach_the_terminal(tmp_path):
    spec = _spec(tmp_path, SSH, **{"\x1b]0;TITLE\x07\x1b[2Jevil": 1})
    r = run_cli("validate", str(spec), timeout=60)
    _refused(r)
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "evil" in r.stderr, repr(r.stderr)


def test_sizes_and_files_that_would_not_end(tmp_path):
    spec = _spec(tmp_path, SLURM, slurm={"nodes": 100_000, "tasks_per_node": 100_000})
    _refused(run_cli("validate", str(spec), timeout=60), "slurm.tasks_per_node", "65,536")
    from orchestrator.backends.base import ConnectFailure
    from orchestrator.backends.ssh.connection import KeyCache
    from orchestrator.schedulers.ssh.sshconfig import SshConfig

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out: list = []

    def load() -> None:
        out.append(SshConfig.load(fifo))
        try:
            KeyCache().get(str(fifo))
        except ConnectFailure as exc:
            out.append(str(exc))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive(), "an ssh config or key that is a FIFO blocked"
    assert "not a regular file" in out[1]


def test_non_finite_seconds_and_a_strategy_of_the_wrong_type_are_named(tmp_path):
    _refused(
        run_cli("validate", str(_spec(tmp_path, SSH, job={"stop_grace_s": float("inf")})), timeout=60),
        "job.stop_grace_s",
    )
    _refused(run_cli("validate", str(_spec(tmp_path, SSH, job={"stop_grace_s": 1e30})), timeout=60), "job.stop_grace_s")
    _refused(
        run_cli("validate", str(_spec(tmp_path, SSH, tensorflow={"strategy": ["a"]})), timeout=60),
        "tensorflow.strategy",
    )


def test_values_only_the_allocation_or_the_node_used_to_refuse_are_named_by_validate(tmp_path):
    over = _spec(tmp_path, SLURM, slurm={"nodes": 1, "tasks_per_node": 60000}, tensorflow={"port": 60000})
    _refused(run_cli("validate", str(over), timeout=60), "slurm.tasks_per_node", "past 65535")
    _refused(
        run_cli(
            "validate",
            str(_spec(tmp_path, SLURM, slurm={"time": "\u0661\u0662:\u0660\u0660:\u0660\u0660"})),
            timeout=60,
        ),
        "slurm.time",
    )
    hosts = [{**SSH["hosts"][0], "gpus": 10**23}, *SSH["hosts"][1:]]
    _refused(run_cli("validate", str(_spec(tmp_path, SSH, hosts=hosts)), timeout=60), "hosts[0].gpus")


@pytest.mark.parametrize(
    "path", ["/", "/tfcluster", "/tfcluster/ckpt", "/dev/shm", "/data/../tfcluster", "//tfcluster/"]
)
def test_a_kubernetes_volume_is_not_mounted_where_tfcluster_mounts_its_own(tmp_path, path):
    k8s = yaml.safe_load((REPO / "cluster_specs" / "k8s-jobset.yaml").read_text())
    k8s["kubernetes"]["volume"] = {"claim_name": "ckpt", "mount_path": path}
    _refused(run_cli("validate", str(_spec(tmp_path, k8s)), timeout=60), "kubernetes.volume.mount_path")
    k8s["kubernetes"]["volume"] = {"claim_name": "ckpt", "mount_path": "/data/ckpt"}
    assert run_cli("validate", str(_spec(tmp_path, k8s)), timeout=60).returncode == 0


def test_render_refuses_two_specs_that_would_write_one_file(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for p in (a, b):
        p.write_text((REPO / "cluster_specs" / "k8s-jobset.yaml").read_text())
    out = tmp_path / "out"
    _refused(run_cli("render", str(a), str(b), "-o", str(out), timeout=60), "two specs are named")
    assert not out.exists()


def test_a_task_of_thousands_of_digits_is_named_briefly():
    r = run_cli("plan", str(REPO / "cluster_specs" / "loopback-3.yaml"), "--task", "worker:" + "9" * 5000, timeout=60)
    _refused(r, "is not a task")
    assert len(r.stderr) < 400 and "int_max_str_digits" not in r.stderr, r.stderr
