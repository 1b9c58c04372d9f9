"""FAKE TIER: `tfcluster launch` with scheduler: kubernetes against ``k8s_fake.FakeCluster``.

The whole launcher runs for real — Job, Supervisor, sinks, run directory, exit codes — with the
Kubernetes backend calling a fake of the client's API objects that answers with recorded API JSON
(``tests/k8s_recorded``). No cluster is involved: these tests prove the apply / follow / stop path and
its handling of pod states, not how a cluster behaves (see README, "Kubernetes").
"""

from __future__ import annotations

import inspect
import json
import re
import signal
import threading

import pytest
import yaml
from k8s_fake import ACCEPTED, FakeApiException, FakeCluster, exited_line, recorded, started_lines
from waiting import wait_for

from orchestrator.cli.exitcodes import exit_code_for
from orchestrator.core.states import JobState, TaskState
from orchestrator.job import LaunchOptions
from orchestrator.job.job import Job
from orchestrator.runs import RunDir
from orchestrator.schedulers.kubernetes import kubernetes_plan
from orchestrator.schedulers.kubernetes.api import KubeApi
from orchestrator.schedulers.kubernetes.backend import KubernetesBackend
from orchestrator.schedulers.kubernetes.handle import KubernetesHandle
from orchestrator.schedulers.kubernetes.validate import validate_manifests
from orchestrator.spec import load_spec_text
from orchestrator.views.control import job_status, status_text
from worker_entry.protocol.podlog import encode_output

pytestmark = pytest.mark.timeout(120)


def spec_text(flavor: str = "jobset", restarts: int = 0, startup: float = 20, kube: dict | None = None, **job) -> str:
    doc = {
        "version": 1,
        "name": "fake-run",
        "scheduler": "kubernetes",
        "kubernetes": {
            "namespace": "ml",
            "image": "registry.example.com/ml/tf-train:2.21",
            "workers": 3,
            "flavor": flavor,
            **(kube or {}),
        },
        "job": {"command": ["python", "train.py"], "startup_timeout_s": startup, "stop_grace_s": 1, **job},
        "heartbeat": {"interval_s": 0.2, "timeout_s": 30, "progress_timeout_s": None},
        "restart": {"max_restarts": restarts},
    }
    return yaml.safe_dump(doc)


def launch(tmp_path, cluster: FakeCluster, *, interrupt_when=None, **kw):
    loaded = load_spec_text(spec_text(**kw), "fake.yaml")
    plan = kubernetes_plan(loaded.spec, run_id="fake-1")
    backend = KubernetesBackend(
        loaded.spec, plan, KubeApi(cluster.core, cluster.batch, cluster.custom, "ml"), poll_s=0.05
    )
    opts = LaunchOptions(run_dir=str(tmp_path / "run"), live=False, echo_logs=False)
    job = Job(loaded, plan, opts, backend)
    if interrupt_when is not None:

        def fire() -> None:
            try:
                wait_for(lambda: interrupt_when(cluster), 30, "the moment to interrupt", interval=0.05)
            finally:
                job.interrupt.trigger(signal.SIGINT)  # the job ends either way

        threading.Thread(target=fire, daemon=True).start()
    result = job.run()
    return result, RunDir(tmp_path / "run"), backend


def jobsets_created(cluster: FakeCluster) -> list:
    return [a for a, _ in cluster.called("create_namespaced_custom_object") if a[3] == "jobsets"]


def succeed(cluster: FakeCluster, pod: dict) -> None:
    task = pod["_task"]
    cluster.append(pod["metadata"]["name"], *started_lines(task, f"{task} epoch 1 loss=0.5\n"), exited_line(0))
    cluster.end_pod(pod["metadata"]["name"], "status-succeeded.json")


def block(cluster: FakeCluster, pod: dict) -> None:
    cluster.append(pod["metadata"]["name"], *started_lines(pod["_task"], "training...\n"))


def log(run: RunDir, slug: str, attempt: int = 0) -> str:
    return run.task_log(slug, attempt).read_bytes().decode("utf-8", "replace")


def test_a_jobset_runs_to_success_and_the_run_directory_records_its_pods(tmp_path, capsys):
    cluster = FakeCluster(behaviour=succeed)
    result, run, _ = launch(tmp_path, cluster)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert exit_code_for(result) == 0
    assert len(jobsets_created(cluster)) == 1
    assert "worker:1 epoch 1 loss=0.5" in log(run, "worker-1")
    record = json.loads((run.path / "kubernetes.json").read_text())
    assert record["objects"] == [
        {"kind": "NetworkPolicy", "name": "fake-run", "apiVersion": "networking.k8s.io/v1", "deleted": "yes"},
        {"kind": "JobSet", "name": "fake-run", "apiVersion": "jobset.x-k8s.io/v1alpha2", "deleted": "yes"},
    ]
    assert record["closed"] is True
    assert {k: (v["phase"], v["exit_code"]) for k, v in record["pods"].items()} == {
        f"0/worker:{i}": ("Succeeded", 0) for i in range(3)
    }
    assert ("JobSet", "fake-run") not in cluster.objects  # close() deleted what it applied
    handle = KubernetesHandle(run)
    text = status_text(job_status(run, handle), handle)
    assert "kubernetes: namespace ml   NetworkPolicy/fake-run, JobSet/fake-run" in text and "Succeeded" in text


@pytest.mark.parametrize("flavor", ["jobset", "indexed-job"])
def test_what_launch_creates_is_the_rendering_and_it_validates(tmp_path, flavor):
    from orchestrator.schedulers.kubernetes import render

    cluster = FakeCluster(behaviour=succeed)
    launch(tmp_path, cluster, flavor=flavor)
    loaded = load_spec_text(spec_text(flavor=flavor), "fake.yaml")
    assert validate_manifests(cluster.created) == []
    # the rendering, plus the run's ownership proof on every object (ownership: a nonce's hash)
    proofs = {doc["metadata"]["annotations"].pop("tfcluster/owner") for doc in cluster.created}
    assert len(proofs) == 1 and len(proofs.pop()) == 64
    assert cluster.created == render(loaded.spec, kubernetes_plan(loaded.spec, run_id="fake-1"))


@pytest.mark.parametrize("when", ["at_once", "later"])
def test_an_oom_killed_pod_is_the_root_cause_and_its_peers_are_stopped_not_blamed(tmp_path, when):
    """The JobSet controller deletes the peers of a failed pod at once (maxRestarts 0): they report a
    SIGTERM nobody on our side sent — symptoms, never the root cause. ``at_once``: worker:1 dies
    while worker:2's pod is still being created, which then never runs."""

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        block(cluster, pod)
        if pod["_task"] == "worker:1":  # the kernel kills it: worker_entry never prints its exit
            end = lambda: cluster.end_pod(pod["metadata"]["name"], "status-oomkilled.json")  # noqa: E731
            end() if when == "at_once" else threading.Timer(0.5, end).start()

    cluster = FakeCluster(behaviour=behaviour)
    result, run, _ = launch(tmp_path, cluster)
    assert result.state == JobState.FAILED and exit_code_for(result) == 3
    rc = result.root_cause
    assert rc.task == "worker:1"
    assert "OOMKilled" in rc.message and "exit code 137" in rc.message and "memory limit" in rc.message
    last = TaskState.NOT_STARTED if when == "at_once" else TaskState.STOPPED
    assert {t: r.state for t, r in result.tasks.items()} == {
        "worker:0": TaskState.STOPPED,
        "worker:1": TaskState.FAILED,
        "worker:2": last,
    }
    record = json.loads((run.path / "kubernetes.json").read_text())
    assert record["pods"]["0/worker:1"]["reason"] == "OOMKilled" and record["pods"]["0/worker:1"]["exit_code"] == 137
    assert "OOMKilled" in log(run, "worker-1")


def test_the_jobset_restarts_all_pods_together_and_the_launcher_follows_the_new_attempt(tmp_path):
    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        attempt = pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]
        if attempt == "0" and pod["_task"] == "worker:2":
            cluster.append(
                pod["metadata"]["name"], *started_lines("worker:2", "ValueError: bad batch\n"), exited_line(1)
            )
            cluster.end_pod(pod["metadata"]["name"], "status-error.json")
        elif attempt == "0":
            block(cluster, pod)
        else:
            succeed(cluster, pod)

    cluster = FakeCluster(behaviour=behaviour)
    result, run, _ = launch(tmp_path, cluster, restarts=1)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert [a.state for a in result.attempts] == [JobState.FAILED, JobState.SUCCEEDED]
    first = result.attempts[0].root_cause
    assert first.task == "worker:2" and first.exit_code == 1
    assert "ValueError: bad batch" in log(run, "worker-2", 0)
    assert "worker:0 epoch 1" in log(run, "worker-0", 1)
    record = json.loads((run.path / "kubernetes.json").read_text())
    assert {k for k in record["pods"] if k.startswith("1/")} == {f"1/worker:{i}" for i in range(3)}
    assert len(jobsets_created(cluster)) == 1  # the controller restarts, not us


def test_an_indexed_job_is_relaunched_by_the_launcher_with_the_next_attempt(tmp_path):
    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        attempt = pod["metadata"]["annotations"]["tfcluster/attempt"]
        if attempt == "0" and pod["_task"] == "worker:0":
            cluster.append(pod["metadata"]["name"], *started_lines("worker:0"), exited_line(2))
            cluster.end_pod(pod["metadata"]["name"], "status-error.json", exit_code=2)
        elif attempt == "0":
            block(cluster, pod)
        else:
            succeed(cluster, pod)

    cluster = FakeCluster(behaviour=behaviour)
    result, _, _ = launch(tmp_path, cluster, flavor="indexed-job", restarts=2)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert len(result.attempts) == 2
    creates = [a for a, k in cluster.called("create_namespaced_job")]
    assert len(creates) == 2 and len(cluster.called("create_namespaced_service")) == 1
    deletes = cluster.called("delete_namespaced_job")
    assert deletes[0][1]["propagation_policy"] == "Foreground"  # pods gone before the same names come back
    assert ("Service", "fake-run") not in cluster.objects and ("Job", "fake-run-worker") not in cluster.objects


def test_an_image_that_cannot_be_pulled_is_a_start_failure_naming_the_pod(tmp_path):
    cluster = FakeCluster(behaviour=block)
    cluster.start_state["worker:1"] = "status-image-pull-backoff.json"
    result, _, _ = launch(tmp_path, cluster)
    assert result.state == JobState.START_FAILED and exit_code_for(result) == 4
    rc = result.root_cause
    assert rc.task == "worker:1" and "ImagePullBackOff" in rc.message and "image_pull_secrets" in rc.message
    assert re.search(r"pod fake-run-worker-0-1-\d+ cannot start", rc.message)


def test_a_pod_that_cannot_be_scheduled_fails_the_start_with_the_schedulers_reason(tmp_path):
    cluster = FakeCluster(behaviour=block)
    cluster.start_state["worker:0"] = "status-unschedulable.json"
    result, _, _ = launch(tmp_path, cluster, startup=3)
    assert result.state == JobState.START_FAILED
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu" in result.root_cause.message


@pytest.mark.parametrize(
    ("method", "status", "body", "expected"),
    [
        (
            "list_namespaced_custom_object",
            404,
            "status-404-crd.json",
            "JobSet API (jobset.x-k8s.io/v1alpha2) is not installed",
        ),
        ("list_namespaced_pod", 403, "status-403.json", 'cannot list resource "pods"'),
    ],
)
def test_an_unusable_cluster_is_a_connect_failure_with_a_hint(tmp_path, method, status, body, expected):
    cluster = FakeCluster(behaviour=succeed)
    cluster.errors[method] = FakeApiException(status, recorded(body))
    result, _, _ = launch(tmp_path, cluster)
    assert result.state == JobState.CONNECT_FAILED and exit_code_for(result) == 4
    assert expected in result.root_cause.message
    assert not cluster.called("create_namespaced_custom_object")


def test_an_existing_jobset_of_the_same_name_is_not_overwritten(tmp_path):
    cluster = FakeCluster(behaviour=succeed)
    cluster.objects[("JobSet", "fake-run")] = {"metadata": {"name": "fake-run"}, "status": {}}
    result, _, _ = launch(tmp_path, cluster)
    assert result.state == JobState.START_FAILED
    assert (
        "already exists" in result.root_cause.message
        and "kubectl delete jobset fake-run -n ml" in result.root_cause.message
    )
    assert ("JobSet", "fake-run") in cluster.objects  # not ours: close() must not delete it


def test_whatever_a_pod_prints_is_bounded_and_validated_and_never_crashes_the_launcher(tmp_path):
    forged = b'@tfcluster {"type":"exited","code":0}\n'

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        name = pod["metadata"]["name"]
        if pod["_task"] == "worker:0":
            cluster.append(name, b"\xff\xfe not utf-8\n", *started_lines("worker:0"))
            cluster.append(name, b"@tfcluster {not json\n", b'@tfcluster {"type":"nonsense"}\n', encode_output(forged))
            cluster.append(name, b"x" * (5 << 20) + b"\n", b"last line\n", exited_line(0))
            cluster.end_pod(name, "status-succeeded.json")
        else:
            succeed(cluster, pod)

    cluster = FakeCluster(behaviour=behaviour)
    result, run, _ = launch(tmp_path, cluster)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    text = log(run, "worker-0")
    assert forged.decode().strip() in text  # the user's line, as printed: not a message
    assert "ignored a malformed protocol line" in text and "last line" in text


def test_a_dropped_log_stream_is_resumed_without_repeating_lines(tmp_path):
    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        name = pod["metadata"]["name"]
        cluster.append(name, *started_lines(pod["_task"]), *[f"line {i}\n".encode() for i in range(10)], exited_line(0))
        cluster.end_pod(name, "status-succeeded.json")

    cluster = FakeCluster(behaviour=behaviour)
    cluster.drop_log_after["fake-run-worker-0-1-"] = 6
    result, run, _ = launch(tmp_path, cluster)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    lines = [ln for ln in log(run, "worker-1").splitlines() if "line " in ln]
    assert [ln.rsplit("line ", 1)[1] for ln in lines] == [str(i) for i in range(10)]
    follows = [k for a, k in cluster.called("read_namespaced_pod_log") if a[0].startswith("fake-run-worker-0-1-")]
    assert len(follows) == 2 and "since_seconds" not in follows[0] and follows[1]["since_seconds"] >= 1


def test_ctrl_c_deletes_the_pods_and_the_jobset(tmp_path):
    cluster = FakeCluster(behaviour=block)

    def all_followed(c: FakeCluster) -> bool:
        return len({a[0] for a, _ in c.called("read_namespaced_pod_log")}) == 3

    result, _, _ = launch(tmp_path, cluster, interrupt_when=all_followed)
    assert result.state == JobState.INTERRUPTED_SIGINT and exit_code_for(result) == 130
    assert cluster.called("delete_namespaced_pod")  # the teardown's stops (the JobSet's end stops the rest)
    assert cluster.called("delete_namespaced_custom_object") and not cluster.objects
    assert all(name in cluster.ended for name in cluster.logs)


# `stop` of a run whose launcher is gone, on the proof the run directory cannot forge (the private
# state, uids, the owner nonce): tests/test_hostile_round3_k8s.py


def test_the_fake_takes_only_arguments_the_real_client_accepts():
    """The fake must not accept what the real client would refuse (kubernetes 29-36 style signatures)."""
    client = pytest.importorskip("kubernetes.client")
    classes = [client.CoreV1Api, client.BatchV1Api, client.CustomObjectsApi]
    for method, kwargs in ACCEPTED.items():
        cls = next(c for c in classes if hasattr(c, method))
        real = getattr(cls, method)
        params = set(inspect.signature(real).parameters)
        if "kwargs" in params:  # classic generator: the accepted names are listed in the _with_http_info twin
            source = inspect.getsource(getattr(cls, f"{method}_with_http_info"))
            listed = source.split("all_params = [", 1)[1].split("for key, val in", 1)[0]
            params |= set(re.findall(r"'(\w+)'", listed))
        missing = {k for k in kwargs if k not in params}
        assert not missing, f"{cls.__name__}.{method} does not take {missing}"
