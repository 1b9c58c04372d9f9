"""Roles beyond identical workers, spec and plan: which roles each strategy allows (each mistake named
at its file, line and field, with what is allowed), and each role's TF_CONFIG as TensorFlow's own
TFConfigClusterResolver reads it (the evaluator's cluster does not list itself, as TF's docs do)."""

from __future__ import annotations

import json
import textwrap

import pytest

from orchestrator.plan.record import PlanRecord
from orchestrator.schedulers.ssh import ssh_plan
from orchestrator.spec import check_spec_text, load_spec_text
from worker_entry.agent.child import child_env
from worker_entry.protocol import NodeConfig, command_line

PS = """\
version: 1
name: ps
hosts:
  - {address: 10.0.0.1, roles: {chief: 1}}
  - {address: 10.0.0.2, tf_port: 3000, roles: {worker: 2, ps: 1}}
  - {address: 10.0.0.3, roles: {worker: 1, ps: 1, evaluator: 1}}
tensorflow: {strategy: parameter_server, port: 2222}
job: {command: [python, train.py]}
"""

MWMS_EVAL = """\
version: 1
name: ev
hosts:
  - {address: 10.0.0.1, roles: {chief: 1}}
  - {address: 10.0.0.2, roles: {worker: 1}}
  - {address: 10.0.0.3, gpus: 0, roles: {evaluator: 1}}
tensorflow: {port: 2222}
job: {command: [python, train.py]}
"""


def errors(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(textwrap.dedent(text), "s.yaml") if p.severity == "error"]


def node_tf_config(node) -> str:
    """The TF_CONFIG worker_entry gives the task: from the NodeConfig the node receives."""
    return child_env(NodeConfig.parse_line(command_line(node.node_config(0))), base={})["TF_CONFIG"]


def plan_of(text: str):
    return ssh_plan(load_spec_text(text).spec, run_id="ps-20260101T000000Z", local_user="me")


@pytest.fixture(scope="module")
def resolver_cls():
    mod = pytest.importorskip("tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver")
    return mod.TFConfigClusterResolver


def test_ps_plan_ranks_ports_and_tf_config_through_tensorflow(resolver_cls, monkeypatch):
    plan = plan_of(PS)
    assert [str(n.task) for n in plan.nodes] == [
        "chief:0",
        "worker:0",
        "worker:1",
        "worker:2",
        "ps:0",
        "ps:1",
        "evaluator:0",
    ]
    cluster = {
        "chief": ["10.0.0.1:2222"],
        # a host's tasks take its tf_port, +1, ... in role order: workers first, then its ps
        "worker": ["10.0.0.2:3000", "10.0.0.2:3001", "10.0.0.3:2222"],
        "ps": ["10.0.0.2:3002", "10.0.0.3:2223"],
    }
    for n in plan.nodes:
        monkeypatch.setenv("TF_CONFIG", node_tf_config(n))
        r = resolver_cls()
        assert r.cluster_spec().as_dict() == cluster  # the evaluator is in no cluster list
        assert (r.task_type, r.task_id) == (n.task.type, n.task.index)
        assert json.loads(node_tf_config(n)) == n.tf_config
        assert n.env["TFCLUSTER_IS_CHIEF"] == ("1" if n.task.type == "chief" else "0")
    evaluator = plan.nodes[-1]
    assert evaluator.tf_port == 0 and evaluator.node_config(0).tf_port is None  # no TF server of its own
    assert evaluator.node_config(0).task.type == "evaluator"
    for n in plan.nodes:  # what worker_entry validates on receipt: every role is a task it accepts
        line = command_line(n.node_config(0)).strip()
        assert NodeConfig.parse_line(line).task == n.node_config(0).task


def test_mwms_with_sidecar_evaluator(resolver_cls, monkeypatch):
    plan = plan_of(MWMS_EVAL)
    assert [str(n.task) for n in plan.nodes] == ["chief:0", "worker:0", "evaluator:0"]
    monkeypatch.setenv("TF_CONFIG", node_tf_config(plan.nodes[-1]))
    r = resolver_cls()
    assert r.cluster_spec().as_dict() == {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]}
    assert (r.task_type, r.task_id) == ("evaluator", 0)
    # worker 0 is not the chief when a chief role exists (it would gather the wrong checkpoints)
    assert [n.is_chief for n in plan.nodes] == [True, False, False]
    assert plan.nodes[1].env["TFCLUSTER_IS_CHIEF"] == "0"


def test_hosts_without_roles_plan_exactly_as_before():
    text = (
        "version: 1\nname: j\nhosts:\n  - {address: a}\n  - {address: b}\n  - {address: c}\n"
        "tensorflow: {chief: true}\njob: {command: [x]}\n"
    )
    plan = plan_of(text)
    assert [(str(n.task), n.host, n.tf_port) for n in plan.nodes] == [
        ("chief:0", "a", 12345),
        ("worker:0", "b", 12345),
        ("worker:1", "c", 12345),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            MWMS_EVAL.replace("{worker: 1}", "{worker: 1, ps: 1}"),
            "s.yaml:5: hosts[1].roles.ps: not a role of strategy multi_worker_mirrored (ps tasks hold variables only "
            "under strategy: parameter_server); allowed: chief, worker, evaluator",
        ),
        (
            MWMS_EVAL.replace("{evaluator: 1}", "{evaluator: 2}"),
            "s.yaml:6: hosts[2].roles.evaluator: 2 evaluator tasks over all hosts; strategy multi_worker_mirrored "
            "allows at most 1 (one sidecar evaluator watches the checkpoints)",
        ),
        (
            PS.replace("{chief: 1}", "{worker: 1}"),
            "s.yaml:4: hosts: strategy parameter_server needs at least 1 chief task(s) (the chief runs the "
            "ClusterCoordinator: exactly one); give a host roles: {chief: 1}",
        ),
        (
            PS.replace("ps: 1}", "ps: 0}").replace("ps: 1,", "ps: 0,"),
            "s.yaml:4: hosts: strategy parameter_server needs at least 1 ps task(s) (the variables live on ps tasks: "
            "at least one); give a host roles: {ps: 1}",
        ),
        (
            PS.replace("{chief: 1}", "{chief: 1, worker: 0}").replace("{worker: 1, ps: 1, evaluator: 1}", "{chief: 1}"),
            "s.yaml:6: hosts[2].roles.chief: 2 chief tasks over all hosts; strategy parameter_server allows at most 1 "
            "(the chief runs the ClusterCoordinator: exactly one)",
        ),
        (
            PS.replace("roles: {chief: 1}", "roles: {}"),
            "s.yaml:4: hosts[0].roles: runs no task: give a role a count of 1 or more, or remove the host",
        ),
        (
            "version: 1\nname: j\nhosts:\n  - {address: a}\n  - {address: b}\ntensorflow: {strategy: parameter_server}\n"
            "job: {command: [x]}\n",
            "s.yaml:6: tensorflow.strategy: parameter_server needs hosts[].roles: one chief, at least one worker and one "
            "ps, e.g. roles: {chief: 1} on one host and roles: {worker: 2, ps: 1} on another",
        ),
        (
            MWMS_EVAL.replace("tensorflow: {port: 2222}", "tensorflow: {port: 2222, chief: true}"),
            "s.yaml:7: tensorflow.chief: with hosts[].roles, name the chief as a role (roles: {chief: 1}) and remove "
            "tensorflow.chief",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2}\ntensorflow: {strategy: parameter_server}\n"
            "job: {command: [x]}\n",
            "s.yaml:5: tensorflow.strategy: parameter_server needs slurm.roles: one chief, at least one worker and one "
            "ps, e.g. slurm.roles: {chief: 1, worker: 2, ps: 1}",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, tasks_per_node: 2, roles: {chief: 1, worker: 2, ps: 2}}\n"
            "tensorflow: {strategy: parameter_server}\njob: {command: [x]}\n",
            "s.yaml:4: slurm.roles: 5 tasks by role, but slurm.nodes x slurm.tasks_per_node = 2 x 2 = 4 task slots: make "
            "them equal (Slurm places the tasks in rank order: chief, workers, ps, evaluator)",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: {worker: 1, ps: 1}}\njob: {command: [x]}\n",
            "s.yaml:4: slurm.roles.ps: not a role of strategy multi_worker_mirrored (ps tasks hold variables only under "
            "strategy: parameter_server); allowed: chief, worker, evaluator",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 3, roles: {chief: 1, worker: 2}}\n"
            "tensorflow: {strategy: parameter_server}\njob: {command: [x]}\n",
            "s.yaml:4: slurm.roles: strategy parameter_server needs at least 1 ps task(s) (the variables live on ps tasks: "
            "at least one); set slurm.roles.ps: 1",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: {chief: 1, worker: 1}}\n"
            "tensorflow: {chief: true}\njob: {command: [x]}\n",
            "s.yaml:5: tensorflow.chief: with slurm.roles, name the chief as a role (roles: {chief: 1}) and remove "
            "tensorflow.chief",
        ),
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: {chief: 1, worker: -1}}\njob: {command: [x]}\n",
            "s.yaml:4: slurm.roles.worker: must be greater than or equal to 0, got -1 (int)",
        ),
        (
            "version: 1\nname: j\nhosts:\n  - {address: a, roles: {boss: 1}}\njob: {command: [x]}\n",
            "s.yaml:4: hosts[0].roles.boss: must be 'chief', 'worker', 'ps' or 'evaluator', got 'boss' (str)",
        ),
        (
            "version: 1\nname: j\nhosts:\n  - {address: a, roles: {worker: 2}}\n  - {address: a, port: 23, tf_port: 12346}\n"
            "job: {command: [x]}\n",
            "s.yaml:5: hosts[1].tf_port: TF port 12346 is already used by hosts[0] on the same machine; TensorFlow's "
            "gRPC server binds every address, so give each task on one machine its own tf_port",
        ),
    ],
)
def test_role_mistakes_are_named_with_what_is_allowed(text, expected):
    assert expected in errors(text), errors(text)


@pytest.mark.parametrize(
    ("text", "only"),
    [
        (
            "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: {chief: 1, master: 1}}\njob: {command: [x]}\n",
            "s.yaml:4: slurm.roles.master: must be 'chief', 'worker', 'ps' or 'evaluator', got 'master' (str)",
        ),
        (
            'version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: {worker: "2"}}\njob: {command: [x]}\n',
            "s.yaml:4: slurm.roles.worker: must be a valid integer, got '2' (str)",
        ),
    ],
)
def test_a_bad_role_or_count_is_the_only_message(text, only):
    """Totals over the valid part only would mislead (task slots, no trainer): one message, the real one."""
    got = errors(text)
    assert got == [only], got


def test_an_explicit_null_is_no_roles():
    text = "version: 1\nname: j\nscheduler: slurm\nslurm: {nodes: 2, roles: null}\ntensorflow: {chief: true}\njob: {command: [x]}\n"
    assert errors(text) == []


def test_evaluator_gpus_may_differ_from_the_collectives():
    assert errors(MWMS_EVAL.replace("gpus: 0", "gpus: 1")) == []
    assert errors(PS) == []


def test_plan_json_and_text_say_what_each_role_means():
    from orchestrator.plan.render import PlanNotes, plan_text

    plan = plan_of(PS)
    d = PlanRecord.from_plan(plan).to_dict()
    assert d["strategy"] == "parameter_server"
    assert d["roles"]["worker"] == {"on_failure": "restart", "trains": False, "collective": False, "holds_go": True}
    assert d["roles"]["ps"]["on_failure"] == "teardown" and d["roles"]["chief"]["trains"] is True
    text = plan_text(plan, PlanNotes(started_by=lambda n: "  remote: -"))
    assert "  worker     restarted alone, in place, when it fails; stopped when the training ended" in text
    assert "evaluator:0  10.0.0.3" in text and "- (not in the cluster)" in text
    plain = plan_of("version: 1\nname: j\nhosts:\n  - {address: a}\njob: {command: [x]}\n")
    plain = PlanRecord.from_plan(plain).to_dict()
    assert "roles" not in plain and "strategy" not in plain  # plan.json of plain MWMS jobs as before


def test_a_shared_host_problem_of_a_job_with_roles_names_tasks_not_workers():
    """Issue 32.1: a PS job's chief and ps are no "workers" in what every host reports alike."""
    from orchestrator.supervise.shared import shared_problems

    busy = [{"run_ms": 100.0, "wait_ms": 300.0}]
    (ps,) = shared_problems({"chief:0": busy, "ps:0": busy, "worker:0": busy, "worker:1": busy})
    assert ps.detail.startswith("all 4 tasks' training processes waited for a CPU 75%"), ps.detail
    (mwms,) = shared_problems({"worker:0": busy, "worker:1": busy})
    assert mwms.detail.startswith("all 2 workers' training processes"), mwms.detail
