"""FAKE TIER (tests/k8s_fake.py): Kubernetes against a crafted run directory and a forged pod (issue 31,
items 4-6). The whole launcher runs for real against the fake API; nothing here proves how a cluster
behaves, only how the launcher handles these shapes.

Item 4: `stop` of a run whose launcher is gone deletes only what the caller's private record of that
run lists, each object only with its recorded uid and the run's owner proof; a crafted run directory
(the issue's: another team's JobSet named, as root) deletes nothing. Item 5: a pod with the job's labels
that the created objects did not make is not followed, and reported. Item 6: the NetworkPolicy.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml
from k8s_fake import FakeCluster, exited_line, started_lines
from test_k8s_launch import launch, spec_text, succeed

from orchestrator.core.states import JobState
from orchestrator.runs import RunDir
from orchestrator.schedulers.kubernetes import kubernetes_plan, render
from orchestrator.schedulers.kubernetes.api import KubeApi
from orchestrator.schedulers.kubernetes.backend import KubernetesBackend
from orchestrator.schedulers.kubernetes.handle import KubernetesHandle
from orchestrator.schedulers.kubernetes.ownership import PrivateState, state_dir
from orchestrator.schedulers.kubernetes.validate import validate_manifests
from orchestrator.spec import load_spec_text
from orchestrator.views.control import stop_job

pytestmark = pytest.mark.timeout(120)


def _killed_launcher(tmp_path, monkeypatch, cluster, name="run", run_id="fake-1"):
    """What a launcher SIGKILLed after creating its objects leaves: the objects, its run directory,
    its private record. The real backend creates them (and nothing closes it)."""
    loaded = load_spec_text(spec_text(), "fake.yaml")
    plan = kubernetes_plan(loaded.spec, run_id=run_id)
    run = RunDir.create(tmp_path / name)
    run.plan_json.write_text(json.dumps({"job": "fake-run", "run_id": run_id, "scheduler": "kubernetes"}))
    run.spec_yaml.write_text(spec_text())
    run.launcher_json.write_text(json.dumps({"pid": 2**22 + 7, "create_time": 1.0}))
    backend = KubernetesBackend(loaded.spec, plan, KubeApi(cluster.core, cluster.batch, cluster.custom, "ml"))
    backend.bind_run(run.path)
    assert backend.connect([]) == []
    backend.objects.apply(backend.api, 0)
    monkeypatch.setattr(
        KubeApi, "connect", classmethod(lambda cls, ns: KubeApi(cluster.core, cluster.batch, cluster.custom, ns))
    )
    return run


def _deletes(cluster) -> list[str]:
    return [m for m, _, _ in cluster.calls if m.startswith("delete_")]


def test_stop_deletes_what_the_killed_launcher_created_by_its_uid(tmp_path, monkeypatch):
    cluster = FakeCluster()
    run = _killed_launcher(tmp_path, monkeypatch, cluster)
    state = PrivateState.load("fake-1")
    assert state is not None and [o["kind"] for o in state.objects] == ["NetworkPolicy", "JobSet"]
    assert os.stat(state_dir()).st_mode & 0o777 == 0o700 and os.stat(state.path_of("fake-1")).st_mode & 0o777 == 0o600
    uid = cluster.objects[("JobSet", "fake-run")]["metadata"]["uid"]
    message = stop_job(run, KubernetesHandle(run))
    assert "JobSet fake-run: deleted; NetworkPolicy fake-run: deleted" in message and not cluster.objects
    deletes = {a[3]: kw for m, a, kw in cluster.calls if m == "delete_namespaced_custom_object"}
    assert deletes["jobsets"]["body"] == {"preconditions": {"uid": uid}}  # the API server checks it is the same
    assert PrivateState.load("fake-1") is None  # nothing left to stop: the record is gone


def test_a_crafted_run_directory_makes_stop_delete_nothing(tmp_path, monkeypatch):
    """The issue's case: a run directory naming another team's JobSet, its job, run id and namespace,
    read by `stop` as an admin. No private record of that run: refused, nothing deleted."""
    cluster = FakeCluster(namespace="team-b")
    theirs = {
        "kind": "JobSet",
        "metadata": {
            "name": "bert-xyz",
            "namespace": "team-b",
            "uid": "0b6f3c2e-1111-4d7c-9a43-2f2f0c1b7e10",
            "labels": {"tfcluster/job": "bert-xyz", "app.kubernetes.io/managed-by": "tfcluster"},
            "annotations": {"tfcluster/run-id": "bert-xyz-20261120", "tfcluster/owner": "f" * 64},
        },
    }
    cluster.objects[("JobSet", "bert-xyz")] = theirs
    run = RunDir.create(tmp_path / "crafted")
    run.plan_json.write_text(json.dumps({"job": "bert-xyz", "run_id": "bert-xyz-20261120", "scheduler": "kubernetes"}))
    run.spec_yaml.write_text(spec_text().replace("namespace: ml", "namespace: team-b"))
    run.kubernetes_json.write_text(
        json.dumps({"namespace": "team-b", "objects": [{"kind": "JobSet", "name": "bert-xyz"}], "closed": False})
    )
    run.launcher_json.write_text(json.dumps({"pid": 2**22 + 7, "create_time": 1.0}))
    monkeypatch.setattr(
        KubeApi, "connect", classmethod(lambda cls, ns: KubeApi(cluster.core, cluster.batch, cluster.custom, ns))
    )
    message = stop_job(run, KubernetesHandle(run))
    assert "refusing: this user has no private record of run 'bert-xyz-20261120'" in message
    assert ("JobSet", "bert-xyz") in cluster.objects and cluster.calls == []


def test_a_crafted_run_directory_naming_one_of_our_runs_is_refused_too(tmp_path, monkeypatch):
    cluster = FakeCluster()
    _killed_launcher(tmp_path, monkeypatch, cluster)  # a real run of ours, launcher gone
    crafted = RunDir.create(tmp_path / "crafted")
    crafted.plan_json.write_text(json.dumps({"job": "fake-run", "run_id": "fake-1", "scheduler": "kubernetes"}))
    crafted.kubernetes_json.write_text(json.dumps({"namespace": "ml", "objects": [{"kind": "JobSet"}]}))
    crafted.launcher_json.write_text(json.dumps({"pid": 2**22 + 7, "create_time": 1.0}))
    message = stop_job(crafted, KubernetesHandle(crafted))
    assert "was launched with the run directory" in message and not _deletes(cluster)
    assert {("JobSet", "fake-run"), ("NetworkPolicy", "fake-run")} <= set(cluster.objects)


def test_an_object_made_again_or_relabelled_since_is_not_deleted(tmp_path, monkeypatch):
    cluster = FakeCluster()
    run = _killed_launcher(tmp_path, monkeypatch, cluster)
    obj = cluster.objects[("JobSet", "fake-run")]
    obj["metadata"]["uid"] = "another-object-of-the-same-name"
    message = stop_job(run, KubernetesHandle(run))
    assert "JobSet fake-run: not deleted: its uid is 'another-object-of-the-same-name'" in message
    assert ("JobSet", "fake-run") in cluster.objects and PrivateState.load("fake-1") is not None


def test_the_launchers_own_close_deletes_by_uid_and_forgets_the_run(tmp_path):
    cluster = FakeCluster(behaviour=succeed)
    result, _, _ = launch(tmp_path, cluster)
    assert result.state == JobState.SUCCEEDED
    assert all("body" in kw for m, _, kw in cluster.calls if m == "delete_namespaced_custom_object")
    assert PrivateState.load("fake-1") is None and not cluster.objects


# --- item 5: forged pods ---------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["jobset", "indexed-job"])
def test_a_forged_pod_with_the_jobs_labels_is_not_followed_and_is_reported(tmp_path, flavor):
    """The issue's case: a pod named aaa-forged (listed first) with worker:0's labels was followed as
    worker:0, and its log became the task's channel. Now its owner chain does not lead to the objects
    the launcher created: ignored, one pod_ignored event; the real worker:0 is followed."""
    forged = b"@tfcluster " + json.dumps({"type": "exited", "code": 0}).encode() + b"\n"

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        if pod["_task"] == "worker:0" and "aaa-forged" not in cluster.pods:
            cluster.forge_pod("aaa-forged", "worker:0", owner=None)
            cluster.append("aaa-forged", *started_lines("worker:0", "FORGED LINE\n"), forged, exited_line(0))
            impostor = {"apiVersion": "batch/v1", "kind": "Job", "name": "fake-run-worker-0", "uid": "0" * 36}
            cluster.forge_pod("aab-forged", "worker:0", owner={**impostor, "controller": True})
        name = pod["metadata"]["name"]
        cluster.append(name, *started_lines(pod["_task"], f"{pod['_task']} real line\n"), exited_line(0))
        cluster.end_pod(name, "status-succeeded.json")

    cluster = FakeCluster(behaviour=behaviour)
    result, run, _ = launch(tmp_path, cluster, flavor=flavor)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    text = run.task_log("worker-0").read_text()
    assert "worker:0 real line" in text and "FORGED LINE" not in text
    events = [json.loads(x) for x in run.events_jsonl.read_text().splitlines()]
    ignored = [e for e in events if e["event"] == "pod_ignored"]
    assert sorted(e["pod"] for e in ignored) == ["aaa-forged", "aab-forged"]
    assert "has no Job as its controller" in next(e for e in ignored if e["pod"] == "aaa-forged")["message"]
    assert next(e for e in ignored if e["pod"] == "aab-forged")["owner"] == f"Job/fake-run-worker-0 uid {'0' * 36}"
    record = json.loads(run.kubernetes_json.read_text())
    assert set(record["ignored_pods"]) == {"aaa-forged", "aab-forged"}
    assert not any("forged" in pod["pod"] for pod in record["pods"].values())


# --- item 6: the NetworkPolicy -------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["jobset", "indexed-job"])
def test_the_rendering_admits_only_the_jobs_own_pods_and_validates(flavor):
    loaded = load_spec_text(spec_text(flavor=flavor), "fake.yaml")
    docs = render(loaded.spec, kubernetes_plan(loaded.spec, run_id="r1"))
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    own = {"matchLabels": {"tfcluster/job": "fake-run"}}
    assert policy["spec"] == {
        "podSelector": own,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": own}]}],
    }
    assert docs.index(policy) < min(i for i, d in enumerate(docs) if d["kind"] in ("Job", "JobSet"))  # before any pod
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Job"] or [
        rj["template"]["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] == "JobSet"
        for rj in d["spec"]["replicatedJobs"]
    ]
    assert pods and all(labels["tfcluster/job"] == "fake-run" for labels in pods)  # it selects them
    assert validate_manifests(docs) == []  # the real schema (kubernetes-validate), strict


def test_the_network_policy_can_be_turned_off():
    doc = yaml.safe_load(spec_text())
    doc["kubernetes"]["network_policy"] = False
    loaded = load_spec_text(yaml.safe_dump(doc), "fake.yaml")
    docs = render(loaded.spec, kubernetes_plan(loaded.spec, run_id="r1"))
    assert [d["kind"] for d in docs] == ["JobSet"]


def test_a_network_policy_that_is_not_valid_is_caught_offline():
    loaded = load_spec_text(spec_text(), "fake.yaml")
    docs = render(loaded.spec, kubernetes_plan(loaded.spec, run_id="r1"))
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"][0]["from"][0]["podSelektor"] = {}
    assert any("NetworkPolicy/fake-run" in p and "podSelektor" in p for p in validate_manifests(docs))
