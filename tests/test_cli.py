"""The command line as a user meets it: exit codes, messages without tracebacks, --json, --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.cli.parser import build_parser

REPO = Path(__file__).resolve().parent.parent

THREE_MISTAKES = """\
version: 1
name: My Job
hosts:
  - address: 10.0.0.1
    gpus: 8
  - address: 10.0.0.2
    gpus: 4
job:
  command: [python, train.py]
  env: {TF_CONFIG: '{}'}
"""


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=120
    )


def test_validate_reports_three_mistakes_in_one_run_without_traceback(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(THREE_MISTAKES)
    r = run_cli("validate", str(spec))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(str(spec))]
    assert lines[:3] == [
        f"{spec}:2: name: 'My Job' is not a valid job name: use lowercase letters, digits and '-', 1-63 characters, "
        "starting with a letter or digit",
        f"{spec}:7: hosts[1].gpus: 4 GPUs but hosts[0] has 8; MultiWorkerMirroredStrategy needs the same number of "
        "GPUs on every task (use the same gpus: on every host)",
        f"{spec}:10: job.env.TF_CONFIG: TF_CONFIG is set by tfcluster from the spec; remove it from job.env",
    ]
    assert f"{spec}: invalid (3 problems)" in r.stderr


def test_validate_many_files_and_json(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(THREE_MISTAKES)
    good = REPO / "cluster_specs" / "loopback-3.yaml"
    code = main(["validate", str(good), str(bad), str(tmp_path / "nope.yaml"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2
    assert [r["valid"] for r in out] == [True, False, False]
    assert len(out[1]["problems"]) == 3
    assert out[1]["problems"][0] == {
        "file": str(bad),
        "line": 2,
        "field": "name",
        "code": "spec",
        "message": "'My Job' is not a valid job name: use lowercase letters, digits and '-', 1-63 characters, starting with a letter or digit",
        "severity": "error",
    }
    assert out[2]["problems"][0]["message"] == "no such file"


def test_validate_all_examples_exit_zero(capsys):
    specs = sorted(str(p) for p in (REPO / "cluster_specs").glob("*.yaml"))
    assert main(["validate", *specs]) == 0
    assert capsys.readouterr().out.count(": valid") == len(specs)


def test_plan_json_is_the_documented_shape(capsys):
    assert main(["plan", str(REPO / "cluster_specs" / "gpu-4x8.yaml"), "--json", "--run-id", "r1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"] == "resnet-4x8" and data["run_id"] == "r1" and data["version"] == 3
    assert data["tasks"][0]["task"] == "chief:0" and len(data["tasks"]) == len(data["cluster"]["worker"]) + 1
    assert data["common"]["env"]["TFCLUSTER_COMMUNICATION"] == "nccl"
    assert data["common"]["argv"] == ["/opt/venv/bin/python", "-m", "worker_entry"]
    # one task in full: its TF_CONFIG (built from the cluster) and whole environment
    assert (
        main(["plan", str(REPO / "cluster_specs" / "gpu-4x8.yaml"), "--json", "--run-id", "r1", "--task", "worker:2"])
        == 0
    )
    node = json.loads(capsys.readouterr().out)
    assert set(node) >= {"host", "ssh_port", "user", "task", "tf_config", "env", "argv"}
    assert node["tf_config"] == {
        "cluster": data["cluster"],
        "task": {"type": "worker", "index": 2},
        "rpc_layer": "grpc",
    }
    assert node["env"]["TFCLUSTER_TASK_INDEX"] == "2" and node["env"]["TFCLUSTER_COMMUNICATION"] == "nccl"


def test_plan_human_table(capsys):
    assert main(["plan", str(REPO / "cluster_specs" / "loopback-3.yaml"), "--run-id", "r1"]) == 0
    out = capsys.readouterr().out
    assert "TASK" in out and "worker:2" in out and "127.0.0.4:23458" in out
    assert "TF_CONFIG:" in out and "TFCLUSTER_COMMUNICATION=ring" in out
    assert out.count("127.0.0.4:23458") == 2  # in the table and once in the cluster, not in every task's TF_CONFIG
    assert main(["plan", str(REPO / "cluster_specs" / "loopback-3.yaml"), "--run-id", "r1", "--task", "worker:1"]) == 0
    one = capsys.readouterr().out
    assert '"task":{"type":"worker","index":1}' in one and "TFCLUSTER_TASK_INDEX=1" in one
    assert main(["plan", str(REPO / "cluster_specs" / "loopback-3.yaml"), "--task", "worker:3"]) == 2
    assert "worker:3 is not a task of this plan (it has worker:0..worker:2)" in capsys.readouterr().err


def test_plan_of_invalid_spec_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(THREE_MISTAKES)
    assert main(["plan", str(bad)]) == 2
    assert "bad.yaml:2: name:" in capsys.readouterr().err


def test_schema_is_json_schema_with_descriptions(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert set(schema["required"]) == {"version", "name", "job"}
    # hosts are required for the default scheduler (ssh); slurm and kubernetes need their sections
    rules = {r["if"]["properties"]["scheduler"]["const"]: r["then"]["required"] for r in schema["allOf"]}
    assert rules == {"ssh": ["hosts"], "slurm": ["slurm"], "kubernetes": ["kubernetes"]}
    host = schema["$defs"]["HostSpec"]
    assert host["additionalProperties"] is False
    assert "description" in host["properties"]["gpus"]


def test_schema_validates_examples_when_jsonschema_is_available(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    main(["schema"])
    schema = json.loads(capsys.readouterr().out)
    for p in (REPO / "cluster_specs").glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(p.read_text()), schema)


def test_every_command_has_help_with_an_example():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert "example:" in text, name
        assert "tfcluster " in text, name


def test_launch_with_missing_spec_is_a_usage_error():
    r = run_cli("launch", "/nonexistent/spec.yaml")
    assert r.returncode == 2
    assert r.stderr.strip() == "tfcluster: error: /nonexistent/spec.yaml: no such file"


def test_double_dash_only_for_launch():
    r = run_cli("validate", "x.yaml", "--", "echo")
    assert r.returncode == 2 and "only accepted by launch" in r.stderr


def test_logs_of_unknown_run_is_a_clear_error(tmp_path):
    r = run_cli("logs", "nosuchjob", "--runs-dir", str(tmp_path))
    assert r.returncode == 2
    assert "no run directory or job named 'nosuchjob'" in r.stderr
    assert "Traceback" not in r.stderr


def test_python_dash_m_and_console_script_agree():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("tfcluster ")
