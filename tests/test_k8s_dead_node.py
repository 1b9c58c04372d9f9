"""FAKE TIER: a restart on Kubernetes does not wait for the node of a failed attempt's pod.

``k8s_fake.FakeCluster.dead_nodes``: a node whose kubelet no longer answers. A pod there, once deleted,
stays Terminating until it is force-deleted, and a Job deleted in the foreground (the launcher's
restart of Indexed Jobs; a JobSet's ``restartStrategy: Recreate``) stays with it: without help the
next attempt would never start. The launcher force-deletes such a pod of an earlier attempt once it
has been terminating longer than its grace + ``stuck.FORCE_MARGIN_S`` (shortened here), and says so.
What a real cluster does is documented in README ("When a host dies for good"), not proven here.
"""

from __future__ import annotations

import json

import pytest
from conftest import jsonl
from k8s_fake import FakeCluster, exited_line, started_lines
from test_k8s_launch import block, launch, succeed

from orchestrator.core.states import JobState
from orchestrator.schedulers.kubernetes import stuck
from orchestrator.schedulers.kubernetes.validate import validate_manifests

pytestmark = pytest.mark.timeout(120)


def _dead_node_at_the_failure(cluster: FakeCluster, pod: dict) -> None:
    """Attempt 0: worker:0's script fails and, at that moment, worker:1's node (node-b) dies; the
    pods of later attempts succeed."""
    labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    attempt = labels.get("jobset.sigs.k8s.io/restart-attempt", notes.get("tfcluster/attempt"))
    if attempt != "0":
        succeed(cluster, pod)
    elif pod["_task"] == "worker:0":
        cluster.dead_nodes.add("node-b")
        cluster.append(pod["metadata"]["name"], *started_lines("worker:0"), exited_line(2))
        cluster.end_pod(pod["metadata"]["name"], "status-error.json", exit_code=2)
    else:
        block(cluster, pod)


@pytest.mark.parametrize("flavor", ["indexed-job", "jobset"])
def test_a_pod_stuck_on_a_dead_node_is_force_deleted_and_the_restart_goes_on(tmp_path, monkeypatch, flavor):
    monkeypatch.setattr(stuck, "FORCE_MARGIN_S", 0.3)
    cluster = FakeCluster(behaviour=_dead_node_at_the_failure)
    cluster.node_of["worker:1"] = "node-b"
    # the restart's pods come once the stuck one is force-deleted: up to its pod's grace (stop_grace_s
    # + 15 s, when the JobSet's own deletion marks it first) + the margin; 20 s to start was too tight
    result, run, _ = launch(tmp_path, cluster, flavor=flavor, restarts=1, startup=60)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert len(result.attempts) == 2
    forced = [a[0] for a, k in cluster.called("delete_namespaced_pod") if k.get("grace_period_seconds") == 0]
    assert len(forced) == 1 and forced[0].startswith("fake-run-worker-") and forced[0] not in cluster.pods, forced
    warnings = [e["message"] for e in jsonl(run.events_jsonl) if e["event"] == "warning"]
    said = [w for w in warnings if forced[0] in w]
    assert len(said) == 1 and "on node node-b" in said[0] and "Force-deleted (grace 0)" in said[0], warnings
    # kubernetes.avoid_unresponsive_nodes is off by default: nothing pins the restart away from a node
    assert "affinity" not in json.dumps(cluster.created)


def test_a_restart_of_indexed_jobs_keeps_off_the_unresponsive_node_when_the_spec_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(stuck, "FORCE_MARGIN_S", 0.3)
    cluster = FakeCluster(behaviour=_dead_node_at_the_failure)
    cluster.node_of["worker:1"] = "node-b"
    kube = {"avoid_unresponsive_nodes": True}
    result, _, _ = launch(tmp_path, cluster, flavor="indexed-job", restarts=1, kube=kube, startup=60)  # as above
    assert result.state == JobState.SUCCEEDED, result.root_cause
    jobs = [d for d in cluster.created if d["kind"] == "Job"]
    assert [j["spec"]["template"]["metadata"]["annotations"]["tfcluster/attempt"] for j in jobs] == ["0", "1"]
    assert "affinity" not in jobs[0]["spec"]["template"]["spec"]  # nothing was known to be dead yet
    assert jobs[1]["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}
                ]
            }
        }
    }
    for doc in cluster.created:
        doc["metadata"]["annotations"].pop("tfcluster/owner", None)
    assert validate_manifests(cluster.created) == []  # the core Job schema (strict) takes the affinity


def test_without_a_dead_node_nothing_is_force_deleted(tmp_path, monkeypatch):
    """The same restart with every kubelet answering: pods end within their grace, none is forced."""
    monkeypatch.setattr(stuck, "FORCE_MARGIN_S", 0.3)

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        attempt = pod["metadata"]["annotations"].get("tfcluster/attempt")
        if attempt != "0":
            succeed(cluster, pod)
        elif pod["_task"] == "worker:0":
            cluster.append(pod["metadata"]["name"], *started_lines("worker:0"), exited_line(2))
            cluster.end_pod(pod["metadata"]["name"], "status-error.json", exit_code=2)
        else:
            block(cluster, pod)

    cluster = FakeCluster(behaviour=behaviour)
    result, _, _ = launch(tmp_path, cluster, flavor="indexed-job", restarts=1)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert [k for _, k in cluster.called("delete_namespaced_pod") if k.get("grace_period_seconds") == 0] == []
