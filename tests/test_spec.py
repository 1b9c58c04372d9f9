"""Spec loading and validation: every rule, each bad input with its exact message and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.core.errors import SpecError, UsageError
from orchestrator.spec import check_spec_text, format_path, load_spec, load_spec_text

REPO = Path(__file__).resolve().parent.parent

MINIMAL = """\
version: 1
name: tiny
hosts:
  - address: 10.0.0.1
job:
  command: [python, train.py]
"""


def problems(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(textwrap.dedent(text), "s.yaml")]


def errors(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(textwrap.dedent(text), "s.yaml") if p.severity == "error"]


def test_minimal_spec_gets_defaults():
    spec = load_spec_text(MINIMAL).spec
    assert spec.ssh.port is None and spec.ssh.known_hosts == "~/.ssh/known_hosts"
    assert spec.tensorflow.port == 12345
    assert spec.tensorflow.communication == "auto"
    assert spec.tensorflow.collective_timeout_s is None  # TF 2.21 leaks a thread per collective with one
    assert spec.tensorflow.legacy_keras is True
    assert spec.job.python == "python3"
    assert spec.heartbeat.interval_s == 1.0 and spec.heartbeat.timeout_s == 10
    assert spec.restart.max_restarts == 0
    assert spec.checkpoint.gather is True


@pytest.mark.parametrize("path", sorted((REPO / "cluster_specs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_are_valid(path):
    loaded = load_spec(path)
    assert loaded.spec.hosts or loaded.spec.scheduler != "ssh"


def test_models_are_frozen():
    spec = load_spec_text(MINIMAL).spec
    with pytest.raises(ValidationError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


def test_string_command_is_split_like_a_shell_never_run_by_one():
    spec = load_spec_text(MINIMAL.replace("[python, train.py]", "'python train.py --msg \"a b\" $HOME'")).spec
    assert spec.job.command == ["python", "train.py", "--msg", "a b", "$HOME"]


def test_numbers_in_command_and_env_become_strings():
    text = MINIMAL.replace(
        "[python, train.py]", "[python, train.py, --epochs, 3, --lr, 0.5]\n  env: {NCCL_IB_DISABLE: 1}"
    )
    spec = load_spec_text(text).spec
    assert spec.job.command[-4:] == ["--epochs", "3", "--lr", "0.5"]
    assert spec.job.env == {"NCCL_IB_DISABLE": "1"}


def test_three_mistakes_reported_together_with_lines():
    text = """\
    version: 1
    name: Bad_Name
    hosts:
      - address: 10.0.0.1
        gpus: 8
      - address: 10.0.0.2
        gpus: 4
    job:
      command: [python, train.py]
    heartbeat:
      interval_s: 5
      timeout_s: 2
    """
    assert errors(text) == [
        "s.yaml:2: name: 'Bad_Name' is not a valid job name: use lowercase letters, digits and '-', 1-63 "
        "characters, starting with a letter or digit",
        "s.yaml:7: hosts[1].gpus: 4 GPUs but hosts[0] has 8; MultiWorkerMirroredStrategy needs the same number of "
        "GPUs on every task (use the same gpus: on every host)",
        "s.yaml:12: heartbeat.timeout_s: must exceed heartbeat.interval_s (5); a worker would be declared lost "
        "between two heartbeats (use at least 3x the interval)",
    ]


def test_type_errors_do_not_hide_cross_field_rules():
    text = """\
    version: 1
    name: x
    hosts:
      - {address: 10.0.0.1, tf_port: 12345}
      - {address: 10.0.0.1, tf_port: 12345, port: 2222, gpus: lots}
    job: {command: [python]}
    """
    out = errors(text)
    assert any("hosts[1].gpus: must be a valid integer" in p for p in out)
    assert any("hosts[1].tf_port: TF port 12345 is already used by hosts[0]" in p for p in out)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "s.yaml:1: spec: the file is empty; a cluster spec needs at least version, name, hosts and job.command"),
        (
            "- a\n- b\n",
            "s.yaml:1: spec: the document must be a mapping of fields (version, name, hosts, job, ...), got a list",
        ),
        (
            "just a string\n",
            "s.yaml:1: spec: the document must be a mapping of fields (version, name, hosts, job, ...), got str",
        ),
        ("version: 1\nname: [\n", "s.yaml:3: spec: invalid YAML: while parsing a flow node"),  # libyaml words the rest
        (
            "version: 1\n---\nname: x\n",
            "s.yaml:3: spec: found a second YAML document ('---'); a cluster spec is one document",
        ),
        ("version: 1\n\tname: x\n", "s.yaml:2: spec: invalid YAML:"),
    ],
)
def test_document_level_errors(text, expected):
    out = problems(text)
    assert len(out) >= 1
    assert out[0].startswith(expected)


def test_duplicate_keys_are_errors_with_both_lines():
    text = MINIMAL + "ssh:\n  port: 22\n  user: a\n  port: 2222\n"
    assert (
        "s.yaml:10: ssh.port: duplicate key (first set at line 8); YAML would silently keep only the last one"
        in errors(text)
    )


def test_duplicate_keys_inside_list_items():
    text = "version: 1\nname: x\nhosts:\n  - address: a\n    address: b\njob: {command: [x]}\n"
    assert (
        "s.yaml:5: hosts[0].address: duplicate key (first set at line 4); YAML would silently keep only the last one"
        in errors(text)
    )


@pytest.mark.parametrize(
    "snippet, expected",
    [
        ("version: 2", "s.yaml:1: version: must be 1 (the only spec version), got 2 (int)"),
        ("name: -bad", "s.yaml:2: name: '-bad' is not a valid job name"),
        ("name: " + "a" * 64, "s.yaml:2: name: 'aaaa"),
        ("hosts: []", "s.yaml:3: hosts: must list at least one host"),
    ],
)
def test_top_level_field_errors(snippet, expected):
    base = "version: 1\nname: ok\nhosts: [{address: h1}]\njob: {command: [x]}\n"
    key = snippet.split(":")[0]
    lines = [snippet if ln.startswith(key + ":") else ln for ln in base.splitlines()]
    out = errors("\n".join(lines) + "\n")
    assert any(p.startswith(expected) for p in out), out


def test_missing_required_fields_each_named():
    out = errors("ssh: {user: a}\n")
    assert "s.yaml:1: version: required: the spec format version, 1" in out
    assert "s.yaml:1: name: required: the job name, e.g. resnet-4x8" in out
    assert "s.yaml:1: hosts: required: a list of hosts, each with an address" in out
    assert "s.yaml:1: job: required: a job section with at least job.command" in out


def test_missing_host_address_and_command():
    out = errors("version: 1\nname: x\nhosts:\n  - gpus: 1\njob:\n  workdir: /x\n")
    assert "s.yaml:4: hosts[0].address: required: the host's IP address or hostname" in out
    assert "s.yaml:6: job.command: required: the training command, e.g. [python, train.py]" in out


def test_unknown_field_suggests_and_lists_allowed():
    out = errors(MINIMAL + "ssh:\n  prot: 22\n")
    assert out == [
        "s.yaml:8: ssh.prot: unknown field 'prot' (did you mean 'port'?); allowed here: config_file, "
        "connect_timeout_s, identity_file, keepalive_s, known_hosts, port, user"
    ]


@pytest.mark.parametrize(
    "host, expected",
    [
        ("{address: h, port: 0}", "hosts[0].port: must be a TCP port between 1 and 65535, got 0"),
        ("{address: h, tf_port: 70000}", "hosts[0].tf_port: must be a TCP port between 1 and 65535, got 70000"),
        ("{address: h, port: '22'}", "hosts[0].port: must be a valid integer, got '22' (str)"),
        ("{address: h, port: true}", "hosts[0].port: must be a valid integer, got True (bool)"),
        ("{address: h, gpus: -1}", "hosts[0].gpus: must be greater than or equal to 0, got -1 (int)"),
        ("{address: 'a b'}", "hosts[0].address: 'a b' is neither an IP address nor a valid hostname"),
        ("{address: -oProxyCommand=x}", "hosts[0].address: must not start with '-' (it would read as an option)"),
        ("{address: 10}", "hosts[0].address: must be a valid string, got 10 (int)"),
    ],
)
def test_host_field_errors(host, expected):
    out = errors(f"version: 1\nname: x\nhosts:\n  - {host}\njob: {{command: [x]}}\n")
    assert any(p.startswith(f"s.yaml:4: {expected}") for p in out), out


def test_ssh_port_range():
    assert any(
        "ssh.port: must be a TCP port between 1 and 65535, got 65536" in p
        for p in errors(MINIMAL + "ssh: {port: 65536}\n")
    )


def test_tensorflow_port_range_and_communication():
    out = errors(MINIMAL + "tensorflow: {port: 0, communication: gloo}\n")
    assert "s.yaml:7: tensorflow.communication: must be 'auto', 'nccl' or 'ring', got 'gloo' (str)" in out
    assert "s.yaml:7: tensorflow.port: must be a TCP port between 1 and 65535, got 0" in out


def test_unique_address_and_ssh_port():
    text = "version: 1\nname: x\nhosts:\n  - {address: h1, tf_port: 1001}\n  - {address: h1, tf_port: 1002}\njob: {command: [x]}\n"
    assert errors(text) == [
        "s.yaml:5: hosts[1].address: h1 port 22 is already hosts[0]; every host entry is one task and needs its own "
        "(address, ssh port)"
    ]


def test_same_address_different_ssh_port_needs_different_tf_port():
    text = "version: 1\nname: x\nhosts:\n  - {address: h1}\n  - {address: h1, port: 2222}\njob: {command: [x]}\n"
    assert errors(text) == [
        "s.yaml:5: hosts[1]: TF port 12345 is already used by hosts[0] on the same machine; TensorFlow's gRPC server "
        "binds every address, so give each task on one machine its own tf_port"
    ]


def test_loopback_addresses_share_tf_ports():
    text = "version: 1\nname: x\nhosts:\n  - {address: 127.0.0.2}\n  - {address: 127.0.0.3}\njob: {command: [x]}\n"
    out = errors(text)
    assert len(out) == 1
    assert "hosts[1]: TF port 12345 is already used by hosts[0] on the same machine" in out[0]
    assert "loopback addresses share this machine's network stack" in out[0]


def test_distinct_tf_ports_on_loopback_are_fine():
    text = "version: 1\nname: x\nhosts:\n  - {address: 127.0.0.2, tf_port: 1}\n  - {address: 127.0.0.3, tf_port: 2}\njob: {command: [x]}\n"
    assert errors(text) == []


@pytest.mark.parametrize(
    "job, expected",
    [
        ("{command: []}", "job.command: must name a program to run, e.g. [python, train.py]"),
        ("{command: ''}", "job.command: must name a program to run, e.g. [python, train.py]"),
        (
            "{command: 'python \"unclosed'}",
            "job.command: cannot split the command like a shell would: No closing quotation",
        ),
        ("{command: [python, {a: 1}]}", "job.command[1]: must be a valid string, got a mapping"),
        ("{command: [python, yes]}", "job.command[1]: YAML read this as the boolean true; quote it to pass a string"),
        (
            '{command: [x], env: {A: "x\\ny"}}',
            "job.env.A: must not contain control characters (found '\\n' at position 1)",
        ),
        (
            '{command: [x], env: {A: "x\\0y"}}',
            "job.env.A: must not contain control characters (found '\\x00' at position 1)",
        ),
        ("{command: [x], env: {A: no}}", "job.env.A: YAML read this as the boolean false; quote it to pass a string"),
        (
            "{command: [x], env: {TF_CONFIG: '{}'}}",
            "job.env.TF_CONFIG: TF_CONFIG is set by tfcluster from the spec; remove it from job.env",
        ),
        (
            "{command: [x], env: {TFCLUSTER_X: '1'}}",
            "job.env.TFCLUSTER_X: TFCLUSTER_X is set by tfcluster from the spec",
        ),
        ("{command: [x], env: {'1BAD': '1'}}", "job.env.1BAD: '1BAD' is not a valid environment variable name"),
        ("{command: [x], startup_timeout_s: 0}", "job.startup_timeout_s: must be greater than 0, got 0 (int)"),
    ],
)
def test_job_errors(job, expected):
    out = errors(f"version: 1\nname: x\nhosts: [{{address: h}}]\njob: {job}\n")
    assert any(p.startswith(f"s.yaml:4: {expected}") for p in out), out


def test_newlines_allowed_in_command_arguments():
    spec = load_spec_text(
        'version: 1\nname: x\nhosts: [{address: h}]\njob: {command: [python, -c, "a=1\\nprint(a)"]}\n'
    ).spec
    assert spec.job.command[2] == "a=1\nprint(a)"


def test_straggler_ratio_must_exceed_one():
    out = errors(MINIMAL + "heartbeat: {straggler_ratio: 1}\n")
    assert out == ["s.yaml:7: heartbeat.straggler_ratio: must be greater than 1, got 1 (int)"]


def test_timeout_equal_to_interval_is_an_error():
    out = errors(MINIMAL + "heartbeat: {interval_s: 2, timeout_s: 2}\n")
    assert len(out) == 1 and "heartbeat.timeout_s: must exceed heartbeat.interval_s (2)" in out[0]


def test_nccl_without_gpus_is_a_warning_not_an_error():
    loaded = load_spec_text(MINIMAL + "tensorflow: {communication: nccl}\n")
    assert [w.severity for w in loaded.warnings] == ["warning"]
    assert "nccl needs GPUs but every host has gpus: 0" in str(loaded.warnings[0])


def test_load_spec_file_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(UsageError, match="is a directory"):
        load_spec(tmp_path)
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"version: 1\nname: \xff\n")
    with pytest.raises(SpecError) as exc:
        load_spec(bad)
    assert str(exc.value.problems[0]) == f"{bad}:2: spec: not valid UTF-8 text"


def test_format_path():
    assert format_path(("hosts", 1, "gpus")) == "hosts[1].gpus"
    assert format_path(()) == "spec"


def test_a_collective_timeout_is_allowed_but_warned_about():
    loaded = load_spec_text(MINIMAL + "tensorflow: {collective_timeout_s: 60}\n")
    assert loaded.spec.tensorflow.collective_timeout_s == 60
    assert [w.field for w in loaded.warnings] == ["tensorflow.collective_timeout_s"]
    assert "one thread per collective" in loaded.warnings[0].message
