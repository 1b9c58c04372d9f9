"""The plan: TF_CONFIG checked by TensorFlow's own TFConfigClusterResolver, env, argv, ssh config."""

from __future__ import annotations

import json

import pytest

from orchestrator.plan import TaskId, redact_env, resolve_communication
from orchestrator.plan.quoting import exec_line, quote_arg
from orchestrator.plan.record import PlanRecord
from orchestrator.plan.render import task_dict
from orchestrator.schedulers.ssh import ssh_plan
from orchestrator.spec import load_spec_text
from worker_entry.agent.child import child_env
from worker_entry.protocol import NodeConfig, command_line


def spec_of(hosts: str, extra: str = "") -> object:
    text = f"version: 1\nname: job\nhosts:\n{hosts}\njob:\n  command: [python, train.py]\n{extra}"
    return load_spec_text(text).spec


def plan_of(hosts: str, extra: str = "", **kw):
    return ssh_plan(spec_of(hosts, extra), run_id="job-20260101T000000Z", local_user="me", **kw)


@pytest.fixture(scope="module")
def resolver_cls():
    tf_resolver = pytest.importorskip("tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver")
    return tf_resolver.TFConfigClusterResolver


def resolve(resolver_cls, monkeypatch, tf_config: str):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    return resolver_cls()


def node_tf_config(node) -> str:
    """The TF_CONFIG the training command gets: the plan's NodeConfig through its wire format, then what
    worker_entry builds from it (the plan itself keeps no TF_CONFIG per task)."""
    config = NodeConfig.parse_line(command_line(node.node_config(0)))
    return child_env(config, base={})["TF_CONFIG"]


@pytest.mark.parametrize("chief", [False, True])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_tf_config_through_tensorflow_resolver(resolver_cls, monkeypatch, chief, n):
    hosts = "\n".join(f"  - {{address: 10.0.0.{i + 1}, gpus: 2}}" for i in range(n))
    plan = plan_of(hosts, f"tensorflow: {{chief: {str(chief).lower()}, port: 2222}}\n")
    endpoints = [f"10.0.0.{i + 1}:2222" for i in range(n)]
    expected_cluster = {"chief": endpoints[:1], "worker": endpoints[1:]} if chief else {"worker": endpoints}
    expected_cluster = {k: v for k, v in expected_cluster.items() if v}
    for i, node in enumerate(plan.nodes):
        r = resolve(resolver_cls, monkeypatch, node_tf_config(node))
        assert r.cluster_spec().as_dict() == expected_cluster
        want = (("chief", 0) if i == 0 else ("worker", i - 1)) if chief else ("worker", i)
        assert (r.task_type, r.task_id) == want
        assert (node.task.type, node.task.index) == want
        assert r.rpc_layer == "grpc"
        # TensorFlow treats a one-task cluster as local (no master address).
        assert r.master() == ("" if n == 1 else f"grpc://{endpoints[i]}")
        assert r.num_accelerators() == {}  # TF looks for local GPUs; none here, and none invented
        assert json.loads(node_tf_config(node)) == node.tf_config  # `plan --task` shows what the node builds
        assert "TF_CONFIG" not in node.env  # never stored per task: it names every task


def test_tf_ports_and_tf_address_override(resolver_cls, monkeypatch):
    plan = plan_of(
        "  - {address: a.example, tf_port: 5000}\n  - {address: b.example, tf_address: 192.168.5.2}\n  - {address: '::1', port: 2200, tf_port: 7000}",
        "tensorflow: {port: 6000}\n",
    )
    r = resolve(resolver_cls, monkeypatch, node_tf_config(plan.nodes[2]))
    assert r.cluster_spec().as_dict() == {"worker": ["a.example:5000", "192.168.5.2:6000", "[::1]:7000"]}
    assert (r.task_type, r.task_id) == ("worker", 2)


def test_chief_is_worker_zero_without_chief_task():
    plan = plan_of("  - {address: a}\n  - {address: b}")
    assert plan.chief.task == TaskId("worker", 0)
    assert plan.nodes[0].env["TFCLUSTER_IS_CHIEF"] == "1"
    assert plan.nodes[1].env["TFCLUSTER_IS_CHIEF"] == "0"
    plan = plan_of("  - {address: a}\n  - {address: b}", "tensorflow: {chief: true}\n")
    assert plan.chief.task == TaskId("chief", 0)
    assert [n.env["TFCLUSTER_IS_CHIEF"] for n in plan.nodes] == ["1", "0"]


def test_environment_of_a_cpu_node():
    plan = plan_of("  - {address: a}\n  - {address: b}", "  env: {MY_VAR: 'a b'}\n")
    env = plan.nodes[1].env
    assert env["MY_VAR"] == "a b"
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["TFCLUSTER_COMMUNICATION"] == "ring"
    assert "TFCLUSTER_COLLECTIVE_TIMEOUT_S" not in env  # no timeout unless asked for (TF 2.21 thread leak)
    assert env["TFCLUSTER_HEARTBEAT_TIMEOUT_S"] == "10"
    assert env["TFCLUSTER_TASK_TYPE"] == "worker" and env["TFCLUSTER_TASK_INDEX"] == "1"
    assert env["TFCLUSTER_NUM_TASKS"] == "2"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["TFCLUSTER_CHECKPOINT_DIR"] == "~/.tfcluster/runs/job-20260101T000000Z/checkpoints"
    assert env["TFCLUSTER_BACKUP_DIR"] == "~/.tfcluster/runs/job-20260101T000000Z/backup"
    assert "NCCL_DEBUG" not in env  # ring: no NCCL defaults


def test_environment_of_a_gpu_node_uses_nccl_and_user_env_wins():
    spec = load_spec_text(
        "version: 1\nname: g\nhosts: [{address: a, gpus: 8}, {address: b, gpus: 8}]\n"
        "job: {command: [x], env: {NCCL_DEBUG: INFO, NCCL_SOCKET_IFNAME: ib0}}\n"
        "tensorflow: {collective_timeout_s: 30.5, legacy_keras: false}\n"
    ).spec
    plan = ssh_plan(spec, run_id="r", local_user="me")
    env = plan.nodes[0].env
    assert plan.communication == "nccl"
    assert env["TFCLUSTER_COMMUNICATION"] == "nccl"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env["TFCLUSTER_COLLECTIVE_TIMEOUT_S"] == "30.5"
    assert env["TFCLUSTER_NUM_GPUS"] == "8"
    assert "TF_USE_LEGACY_KERAS" not in env


def test_default_nccl_debug_on_gpus():
    plan = plan_of("  - {address: a, gpus: 1}")
    assert plan.nodes[0].env["NCCL_DEBUG"] == "WARN"


def test_no_collective_timeout_when_null():
    plan = plan_of("  - {address: a}", "tensorflow: {collective_timeout_s: null}\n")
    assert "TFCLUSTER_COLLECTIVE_TIMEOUT_S" not in plan.nodes[0].env


@pytest.mark.parametrize(
    "setting, gpus, want", [("auto", 0, "ring"), ("auto", 8, "nccl"), ("ring", 8, "ring"), ("nccl", 0, "nccl")]
)
def test_resolve_communication(setting, gpus, want):
    assert resolve_communication(setting, gpus) == want


def test_argv_and_shell_line_hold_no_user_data():
    plan = plan_of("  - {address: a}")
    node = plan.nodes[0]
    assert node.argv == ("python3", "-m", "worker_entry")
    assert node.shell_line() == "exec python3 -m worker_entry"
    cfg = node.node_config(2)
    assert cfg.argv == ["python", "train.py"]
    assert cfg.env["TFCLUSTER_ATTEMPT"] == "2"
    assert cfg.remote_dir == "~/.tfcluster/runs/job-20260101T000000Z/worker-0/attempt-2"
    assert (cfg.task.type, cfg.task.index, cfg.attempt) == ("worker", 0, 2)
    # what the node receives is what the plan built: the config survives its own wire format
    assert NodeConfig.parse_line(command_line(cfg)) == cfg
    # the node gives up on a silent launcher a little before the launcher gives up on the node
    assert cfg.launcher_timeout_s == 9.0 and cfg.heartbeat_interval_s == 1.0


def test_quoting_of_the_interpreter():
    assert quote_arg("~/venv/bin/python") == "~/venv/bin/python"
    assert quote_arg("~/my venv/python") == "~/'my venv/python'"
    assert quote_arg("/opt/py;rm -rf /") == "'/opt/py;rm -rf /'"
    assert exec_line(["/a b/python", "-m", "worker_entry"]) == "exec '/a b/python' -m worker_entry"


def test_ssh_config_lookup_is_honoured_but_spec_wins():
    def lookup(host):
        return {
            "hostname": f"{host}.real",
            "user": "cfguser",
            "port": "2022",
            "identityfile": ["~/.ssh/k"],
            "proxycommand": "nc %h %p",
            "_first_proxy": "proxycommand",
        }

    plan = plan_of("  - {address: alias1}\n  - {address: alias2, user: bob, port: 22}", ssh_lookup=lookup)
    a, b = plan.nodes
    assert (a.ssh.hostname, a.ssh.user, a.ssh.port, a.ssh.identity_files) == (
        "alias1.real",
        "cfguser",
        2022,
        ("~/.ssh/k",),
    )
    assert a.ssh.proxy_command == "nc alias1.real 2022"  # tokens expanded with what is really used
    assert (b.ssh.user, b.ssh.port) == ("bob", 22)
    assert b.ssh.proxy_command == "nc alias2.real 22"  # the spec's port, not the config's
    assert a.tf_address == "alias1.real"  # TF must get the real name, not the ssh alias


def test_defaults_without_ssh_config():
    plan = plan_of("  - {address: a}")
    t = plan.nodes[0].ssh
    assert (t.hostname, t.user, t.port, t.identity_files, t.known_hosts) == ("a", "me", 22, (), "~/.ssh/known_hosts")


def test_plan_is_pure():
    spec = spec_of("  - {address: a}\n  - {address: b}")
    one = PlanRecord.from_plan(ssh_plan(spec, run_id="r", local_user="u")).to_json()
    two = PlanRecord.from_plan(ssh_plan(spec, run_id="r", local_user="u")).to_json()
    assert one == two


def test_secrets_redacted_in_printed_plan():
    plan = plan_of("  - {address: a}", "")
    env = {"WANDB_API_KEY": "s3cr3t", "HF_TOKEN": "t", "NCCL_DEBUG": "WARN", "DB_PASSWORD": "p"}
    assert redact_env(env) == {
        "WANDB_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
        "NCCL_DEBUG": "WARN",
        "DB_PASSWORD": "<redacted>",
    }
    plan = plan_of("  - {address: a}", "  env: {WANDB_API_KEY: s3cr3t}\n")
    assert PlanRecord.from_plan(plan).common["env"]["WANDB_API_KEY"] == "<redacted>"
    assert task_dict(plan.nodes[0])["env"]["WANDB_API_KEY"] == "<redacted>"
    assert task_dict(plan.nodes[0], show_secrets=True)["env"]["WANDB_API_KEY"] == "s3cr3t"


def test_plan_json_shape():
    """The record keeps what every task shares once, and each task as its name, host, endpoint, GPUs."""
    d = json.loads(PlanRecord.from_plan(plan_of("  - {address: a}\n  - {address: b, port: 2222}")).to_json())
    assert d["job"] == "job" and d["version"] == 3
    assert d["cluster"] == {"worker": ["a:12345", "b:12345"]}
    assert d["tasks"][1] == {"task": "worker:1", "host": "b", "gpus": 0, "tf_address": "b:12345", "ssh": "me@b:2222"}
    assert d["common"]["argv"] == ["python3", "-m", "worker_entry"] and "TF_CONFIG" not in d["common"]["env"]
    one = task_dict(plan_of("  - {address: a}\n  - {address: b, port: 2222}").nodes[1])  # plan --task
    for key in ("host", "ssh_port", "user", "task", "tf_config", "env", "argv"):
        assert key in one
    assert one["ssh_port"] == 2222 and one["host"] == "b" and one["user"] == "me"
    assert one["tf_config"]["cluster"] == d["cluster"] and one["env"]["TFCLUSTER_TASK_INDEX"] == "1"


def test_task_id_parse():
    assert TaskId.parse("worker:3") == TaskId("worker", 3)
    assert TaskId.parse("chief-0") == TaskId("chief", 0)
    assert TaskId.parse("ps:1") == TaskId("ps", 1)  # roles (tensorflow.strategy: parameter_server)
    with pytest.raises(ValueError):
        TaskId.parse("boss:1")
