"""Credentials of a Kubernetes job live in a Secret, never in the Jobs' or pods' plain env or args: the
rendering (both flavours, validated offline), what `launch` applies and deletes (fake API), and the
pods' command, which the kubelet's `$(...)` expansion turns back into exactly the plan's words."""

from __future__ import annotations

import base64
import json
import re

import pytest
import yaml
from k8s_fake import FakeCluster, workload
from test_k8s_launch import launch, succeed

from orchestrator.schedulers.kubernetes import kubernetes_plan
from orchestrator.schedulers.kubernetes.validate import validate_manifests
from orchestrator.spec import check_spec_text, load_spec_text
from worker_entry.agent.modes.kubernetes import pod_node_config

pytest.importorskip("kubernetes_validate")
pytest.importorskip("jsonschema")

SECRETS = {
    "WANDB_API_KEY": "wandb-0123456789abcdef",
    "DB_PASSWORD": "hunter2-db",
    "GITHUB_PAT": "pat-abcdef123456",
    "DATA_URL": "https://tok-0a1b2c3d@data.example.com/set",
}
COMMAND = ["python", "train.py", "--hf-token", "hf-secret-7777", "--price", "$5 $(HOME) $$"]
SNIPPET = ["bash", "-c", "export API_TOKEN=sn-8888; exec python t.py --lr 1"]


def spec_text(flavor: str, command=COMMAND, **kube) -> str:
    doc = {
        "version": 1,
        "name": "secret-run",
        "scheduler": "kubernetes",
        "kubernetes": {
            "namespace": "ml",
            "image": "registry.example.com/tf:2.21",
            "workers": 2,
            "flavor": flavor,
            **kube,
        },
        "job": {"command": command, "env": {**SECRETS, "NCCL_DEBUG": "WARN", "COST": "$(NOT_EXPANDED)"}},
        "tensorflow": {"chief": True},
    }
    return yaml.safe_dump(doc)


def rendered(flavor: str, command=COMMAND, **kube):
    spec = load_spec_text(spec_text(flavor, command, **kube)).spec
    plan = kubernetes_plan(spec, run_id="r1")
    return spec, plan, workload(spec, plan)


def by_type(docs) -> dict[str, dict]:
    """task type -> its pods' container, from either flavour."""
    out = {}
    for doc in docs:
        if doc["kind"] == "JobSet":
            for rj in doc["spec"]["replicatedJobs"]:
                out[rj["name"]] = rj["template"]["spec"]["template"]["spec"]["containers"][0]
        elif doc["kind"] == "Job":
            out[doc["metadata"]["labels"]["tfcluster/task-type"]] = doc["spec"]["template"]["spec"]["containers"][0]
    return out


def containers(docs):
    return list(by_type(docs).values())


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a `value`/`command`/`args` string (k8s.io/kubernetes third_party expansion):
    `$$` is `$`, `$(NAME)` of a defined NAME its value, anything else as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1 and text[i + 2 : end] in env:
                    out.append(env[text[i + 2 : end]])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("flavor", ["jobset", "indexed-job"])
@pytest.mark.parametrize("command", [COMMAND, SNIPPET], ids=["flags", "bash-c"])
def test_credentials_are_in_a_secret_and_nowhere_else(flavor, command):
    _, _, docs = rendered(flavor, command)
    assert docs[0]["kind"] == "Secret" and docs[0]["metadata"]["name"] == "secret-run-credentials"
    assert docs[0]["metadata"]["labels"]["tfcluster/job"] == "secret-run"
    assert validate_manifests(docs) == []
    data = {k: base64.b64decode(v).decode() for k, v in docs[0]["data"].items()}
    secrets = [*SECRETS.values(), "hf-secret-7777" if command is COMMAND else "sn-8888"]
    for secret in secrets:
        assert any(secret in v for v in data.values()), secret
    others = yaml.safe_dump_all(docs[1:])
    for secret in secrets:
        assert secret not in others, secret
        assert base64.b64encode(secret.encode()).decode()[:12] not in others
    for c in containers(docs):
        refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in c["env"]
            if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
        }
        assert set(SECRETS) <= set(refs)
        assert all(r["name"] == "secret-run-credentials" and r["key"] in data for r in refs.values())


@pytest.mark.parametrize("flavor", ["jobset", "indexed-job"])
def test_the_kubelets_expansion_gives_the_pod_exactly_the_plans_command_and_environment(flavor):
    """`$` in the user's words is escaped, a credential word is `$(TFCLUSTER_SECRET_ARG_3)`: after the
    kubelet's expansion with the Secret's values the pod runs the plan's command and environment."""
    _, plan, docs = rendered(flavor)
    data = {k: base64.b64decode(v).decode() for k, v in docs[0]["data"].items()}
    for node in plan.nodes:
        c = by_type(docs)[node.task.type]
        env: dict[str, str] = {}
        for e in c["env"]:  # in order, as the kubelet builds it
            if "value" in e:
                env[e["name"]] = kubelet_expand(e["value"], env)
            elif "secretKeyRef" in e.get("valueFrom", {}):
                env[e["name"]] = data[e["valueFrom"]["secretKeyRef"]["key"]]
        args = [kubelet_expand(a, env) for a in c["args"]]
        assert args == list(node.command)
        assert [kubelet_expand(a, env) for a in c["command"]] == [*node.argv, "--"]
        for key, value in node.env.items():
            if key in env:
                assert env[key] == value, key
        env.update({"JOB_COMPLETION_INDEX": "0", "TFCLUSTER_ATTEMPT": "0"})
        assert pod_node_config(args, env).argv == list(node.command)
    assert "$$5 $$(HOME) $$$$" in yaml.safe_dump_all(docs)  # escaped, not expanded by the kubelet


def test_a_spec_without_credentials_renders_no_secret():
    spec = load_spec_text(
        spec_text("jobset", ["python", "t.py"])
        .replace("WANDB_API_KEY", "X1")
        .replace("DB_PASSWORD", "X2")
        .replace("GITHUB_PAT", "X3")
        .replace("tok-0a1b2c3d@", "")
    ).spec
    docs = workload(spec, kubernetes_plan(spec, run_id="r1"))
    assert [d["kind"] for d in docs] == ["JobSet"]


def test_an_existing_secret_named_in_the_spec_is_referenced():
    _, _, docs = rendered("indexed-job", env_secret="team-wandb")
    assert validate_manifests(docs) == []
    for c in containers(docs):
        assert c["envFrom"] == [{"secretRef": {"name": "team-wandb"}}]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Team_Wandb", "is not a DNS-1123 name"),
        ("secret-run-credentials", "is the Secret tfcluster renders for job.env's credentials"),
    ],
)
def test_the_named_secret_is_validated(value, message):
    problems = check_spec_text(spec_text("jobset", env_secret=value), "s.yaml")
    assert any(p.field == "kubernetes.env_secret" and message in p.message for p in problems), problems


def test_launch_applies_the_secret_first_and_deletes_it_with_the_rest(tmp_path):
    cluster = FakeCluster(behaviour=succeed)
    result, run, _ = launch(tmp_path, cluster, env=dict(SECRETS))
    assert result.state.value == "succeeded", result.root_cause
    assert [b["kind"] for b in cluster.created] == ["Secret", "NetworkPolicy", "JobSet"]
    assert not cluster.objects  # the Secret went with the JobSet
    assert ("delete_namespaced_secret") in {m for m, _, _ in cluster.calls}
    record = json.loads((run.path / "kubernetes.json").read_text())
    assert [o["kind"] for o in record["objects"]] == ["Secret", "NetworkPolicy", "JobSet"]
    stored = "".join(p.read_text(errors="replace") for p in run.path.rglob("*") if p.is_file())
    for secret in SECRETS.values():
        assert secret not in stored and not re.search(
            re.escape(base64.b64encode(secret.encode()).decode()[:12]), stored
        )
