"""`tfcluster render`: every rendering of the example specs passes both offline validators — core kinds
against Kubernetes' OpenAPI schemas (kubernetes-validate, pinned version), the JobSet against the CRD
schema vendored from kubernetes-sigs/jobset — and says what MWMS needs (restart all together, stable
DNS names published before readiness, one pod per task, the checkpoint volume)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.core.errors import UsageError
from orchestrator.schedulers.kubernetes import kubernetes_plan, render, with_flavor
from orchestrator.schedulers.kubernetes.validate import JOBSET_RELEASE, KUBE_VERSION, SCHEMA_PATH, validate_manifests
from orchestrator.spec import load_spec, load_spec_text
from worker_entry.agent.child import child_env
from worker_entry.agent.modes.kubernetes import pod_node_config

pytest.importorskip("kubernetes_validate")
pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parent.parent
# the MWMS examples (k8s-ps.yaml, with roles: tests/test_k8s_roles.py)
SPECS = sorted(p for p in (REPO / "cluster_specs").glob("k8s-*.yaml") if p.name != "k8s-ps.yaml")
FLAVORS = ["jobset", "indexed-job"]


def rendered(path: Path, flavor: str, run_id: str = "r1"):
    """The workload's documents (the NetworkPolicy beside them: test_hostile_round3_k8s.py)."""
    spec = with_flavor(load_spec(path).spec, flavor)
    plan = kubernetes_plan(spec, run_id=run_id)
    return spec, plan, [d for d in render(spec, plan) if d["kind"] != "NetworkPolicy"]


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """task type -> pod template, from either flavour."""
    out = {}
    for doc in docs:
        if doc["kind"] == "JobSet":
            for rj in doc["spec"]["replicatedJobs"]:
                out[rj["name"]] = rj["template"]["spec"]["template"]
        elif doc["kind"] == "Job":
            out[doc["metadata"]["labels"]["tfcluster/task-type"]] = doc["spec"]["template"]
    return out


def test_the_examples_exist_for_both_flavours():
    assert {p.name for p in SPECS} == {"k8s-jobset.yaml", "k8s-indexed.yaml"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_cli_renders_every_example_and_both_validators_accept_it(flavor, capsys):
    assert main(["render", *map(str, SPECS), "--flavor", flavor, "--validate"]) == 0
    out, err = capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert validate_manifests(docs) == []
    assert err.count(f"valid for Kubernetes {KUBE_VERSION} and JobSet {JOBSET_RELEASE}") == len(SPECS)
    kinds = sorted(d["kind"] for d in docs if d["kind"] != "NetworkPolicy")
    assert kinds == (["JobSet", "JobSet"] if flavor == "jobset" else ["Job", "Job", "Job", "Service", "Service"])
    assert sum(d["kind"] == "NetworkPolicy" for d in docs) == len(SPECS)


def test_render_writes_one_applyable_file_per_job(tmp_path, capsys):
    assert main(["render", *map(str, SPECS), "-o", str(tmp_path / "m")]) == 0
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == ["mnist-indexed.yaml", "mnist-jobset.yaml"]
    text = (tmp_path / "m" / "mnist-jobset.yaml").read_text()
    assert text.startswith("# mnist-jobset: 5 MWMS task(s) as jobset in namespace ml-training")


def test_render_refuses_an_ssh_spec():
    assert main(["render", str(REPO / "cluster_specs" / "loopback-3.yaml")]) == 2


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_jobset_restarts_all_pods_together_under_stable_dns_names(path):
    spec, plan, (js,) = rendered(path, "jobset")
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    # Recreate: each child Job made again once its own pods are gone (not BlockingRecreate: all of them)
    assert js["spec"]["failurePolicy"] == {"maxRestarts": spec.restart.max_restarts, "restartStrategy": "Recreate"}
    assert js["spec"]["network"] == {
        "enableDNSHostnames": True,
        "subdomain": spec.name,
        "publishNotReadyAddresses": True,
    }
    jobs = {rj["name"]: rj for rj in js["spec"]["replicatedJobs"]}
    assert set(jobs) == ({"chief", "worker"} if spec.tensorflow.chief else {"worker"})
    worker = jobs["worker"]
    assert worker["replicas"] == 1
    job = worker["template"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"], job["backoffLimit"]) == (
        "Indexed",
        spec.kubernetes.workers,
        spec.kubernetes.workers,
        0,
    )
    # the plan's TF_CONFIG names exactly the hostnames the JobSet controller gives the pods
    assert plan.nodes[-1].tf_config["cluster"]["worker"][-1] == (
        f"{spec.name}-worker-0-{spec.kubernetes.workers - 1}.{spec.name}:{spec.tensorflow.port}"
    )


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_indexed_job_has_a_headless_service_publishing_unready_pods(path):
    _, _, docs = rendered(path, "indexed-job")
    service, jobs = docs[0], docs[1:]
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    for job in jobs:
        template = job["spec"]["template"]
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["completionMode"] == "Indexed"
        assert template["spec"]["subdomain"] == service["metadata"]["name"]
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
        assert template["metadata"]["annotations"]["tfcluster/attempt"] == "0"


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_pod_runs_worker_entry_with_resources_volume_and_a_sane_security_context(path, flavor):
    spec, _, docs = rendered(path, flavor)
    k8s = spec.kubernetes
    for task_type, template in pod_templates(docs).items():
        pod = template["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["terminationGracePeriodSeconds"] > spec.job.stop_grace_s
        assert template["metadata"]["labels"]["tfcluster/job"] == spec.name
        assert template["metadata"]["labels"]["tfcluster/task-type"] == task_type
        (c,) = pod["containers"]
        assert c["command"] == [spec.job.python, "-m", "worker_entry", "kubernetes", "--"]
        assert c["args"] == spec.job.command
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert "TF_CONFIG" not in env  # each pod builds its own from its index
        if k8s.gpus_per_worker:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == str(k8s.gpus_per_worker)
        assert c["resources"]["requests"] == {k: v for k, v in k8s.requests.model_dump().items() if v}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts[k8s.volume.mount_path]]["persistentVolumeClaim"] == {"claimName": k8s.volume.claim_name}
        for var in ("TFCLUSTER_CHECKPOINT_DIR", "TFCLUSTER_BACKUP_DIR"):
            assert env[var].startswith(k8s.volume.mount_path + "/")
        assert pod.get("nodeSelector", {}) == k8s.node_selector


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_a_pod_computes_exactly_the_plans_tf_config_and_environment(path, flavor):
    """What the rendering leaves to the pod (TF_CONFIG, task index, chief) is what the plan says."""
    _, plan, docs = rendered(path, flavor)
    templates = pod_templates(docs)
    for node in plan.nodes:
        c = templates[node.task.type]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        env["JOB_COMPLETION_INDEX"] = str(node.task.index)
        env["TFCLUSTER_ATTEMPT"] = "0"
        config = pod_node_config(c["args"], env)
        given = child_env(config, base={})  # what worker_entry gives the command: TF_CONFIG from the cluster
        want = {**node.env, "TF_CONFIG": json.dumps(node.tf_config, separators=(",", ":"))}
        for key in ("TF_CONFIG", "TFCLUSTER_TASK_INDEX", "TFCLUSTER_IS_CHIEF"):
            assert given[key] == want[key], (node.task, key)
        static = {
            k: v for k, v in node.env.items() if k not in ("TF_CONFIG", "TFCLUSTER_TASK_INDEX", "TFCLUSTER_IS_CHIEF")
        }
        assert {k: env[k] for k in static} == static
        assert json.loads(given["TF_CONFIG"]) == node.tf_config
        assert (config.task.type, config.task.index, config.tf_port, config.gpus) == (
            node.task.type,
            node.task.index,
            node.tf_port,
            node.gpus,
        )
        assert config.wait_for_go is False


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["spec"].update(failurePolicy={"maxRestart": 3}), "'maxRestart' was unexpected"),
        (
            lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"].update(backoffLimit="none"),
            "is not of type 'integer'",
        ),
        (
            lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0].update(
                imagee="x"
            ),
            "'imagee' was unexpected",
        ),
        (lambda d: d["metadata"].update(name="x" * 58), "would be longer than 63 characters"),
        (lambda d: d["spec"]["network"].update(subdomain="9lives"), "must be a DNS-1035 label"),
    ],
)
def test_the_validators_have_teeth(mutate, expected):
    _, _, (js,) = rendered(SPECS[1], "jobset")
    bad = copy.deepcopy(js)
    mutate(bad)
    problems = validate_manifests([bad])
    assert any(expected in p for p in problems), problems


def test_core_validation_catches_a_bad_service_and_job():
    _, _, docs = rendered(SPECS[0], "indexed-job")
    service, job = copy.deepcopy(docs[0]), copy.deepcopy(docs[1])
    service["spec"]["clusterIP"] = 5
    job["spec"]["template"]["spec"]["restartPolicy"] = ["Never"]
    problems = validate_manifests([service, job])
    assert len(problems) == 2 and all(f"Kubernetes {KUBE_VERSION} schema" in p for p in problems)


@pytest.mark.parametrize(
    ("name", "workers", "message"),
    [("a" * 50, 12, "is too long for Kubernetes"), ("9lives", 2, "cannot name a Kubernetes Service")],
)
def test_names_kubernetes_would_refuse_are_refused_when_planning(name, workers, message):
    text = f"version: 1\nname: '{name}'\nscheduler: kubernetes\nkubernetes: {{image: x, workers: {workers}}}\njob: {{command: [t]}}\n"
    with pytest.raises(UsageError, match=message):
        kubernetes_plan(load_spec_text(text).spec, run_id="r")


def test_the_vendored_jobset_schema_is_the_recorded_release():
    readme = (SCHEMA_PATH.parent / "README.md").read_text()
    assert f"`{JOBSET_RELEASE}`" in readme and "Apache License 2.0" in readme and "kubernetes-sigs/jobset" in readme
    schema = json.loads(SCHEMA_PATH.read_text())
    assert {"spec", "status"} <= set(schema["properties"])
    assert '"description"' not in SCHEMA_PATH.read_text()  # stripped, as the README says


def test_rendering_and_the_ssh_path_never_import_the_kubernetes_client():
    code = (
        "import sys\n"
        "from orchestrator.cli.main import main\n"
        "import orchestrator.job.job, orchestrator.backends.ssh, orchestrator.schedulers.kubernetes.manifests\n"
        f"main(['render', {str(SPECS[0])!r}])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kubernetes_validate')]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
