"""Roles under Kubernetes (issue 25.4): ``kubernetes.roles`` checked at its file, line and field; one
replicated job (or Indexed Job) per role, every manifest accepted by both offline validators, every
pod's TF_CONFIG read by TensorFlow's own TFConfigClusterResolver; and — FAKE TIER, ``k8s_fake`` — a
parameter-server job whose worker pod dies has that worker restarted in place (its Job's new pod,
same index) and succeeds when the chief completes, while a ps pod's death ends it with ps:0 as root
cause."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import pytest
import yaml
from conftest import jsonl
from k8s_fake import FakeCluster, exited_line, started_lines, workload
from waiting import wait_for

from orchestrator.cli.exitcodes import exit_code_for
from orchestrator.core.states import JobState, TaskState
from orchestrator.job import LaunchOptions
from orchestrator.job.job import Job
from orchestrator.runs import RunDir
from orchestrator.schedulers.kubernetes import kubernetes_plan, with_flavor
from orchestrator.schedulers.kubernetes.api import KubeApi
from orchestrator.schedulers.kubernetes.backend import KubernetesBackend
from orchestrator.spec import check_spec_text, load_spec_text
from worker_entry.agent.child import child_env
from worker_entry.agent.modes.kubernetes import pod_node_config

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parent.parent
FLAVORS = ["jobset", "indexed-job"]


def spec_text(section: str, strategy: str = "parameter_server", **extra) -> str:
    head = "version: 1\nname: psk\nscheduler: kubernetes\nkubernetes:\n  namespace: ml\n"
    head += "  image: registry.example.com/ml/tf:2.21\n  gpus_per_worker: 1\n"
    tail = f"tensorflow: {{strategy: {strategy}, port: 2222}}\njob: {{command: [python, train.py]}}\n"
    return (
        head
        + textwrap.indent(section, "  ")
        + "\n"
        + tail
        + "".join(f"{k}: {json.dumps(v)}\n" for k, v in extra.items())
    )


PS = "roles: {chief: 1, worker: 2, ps: 2, evaluator: 1}"


def errors(text: str) -> list[str]:
    return [str(p) for p in check_spec_text(text, "s.yaml") if p.severity == "error"]


@pytest.mark.parametrize(
    ("section", "strategy", "expected"),
    [
        (
            "namespace: ml",
            "multi_worker_mirrored",
            "s.yaml:5: kubernetes: needs kubernetes.workers (the worker pods) or kubernetes.roles",
        ),
        (
            "workers: 2\nroles: {worker: 2}",
            "multi_worker_mirrored",
            "s.yaml:8: kubernetes.workers: not used with kubernetes.roles",
        ),
        ("workers: 2", "parameter_server", "tensorflow.strategy: parameter_server needs kubernetes.roles"),
        (
            "roles: {worker: 2, ps: 1}",
            "multi_worker_mirrored",
            "s.yaml:8: kubernetes.roles.ps: not a role of strategy multi_worker_mirrored",
        ),
        (
            "roles: {chief: 1, worker: 2}",
            "parameter_server",
            "kubernetes.roles: strategy parameter_server needs at least 1 ps task(s)",
        ),
        ("roles: {chief: 2, worker: 1, ps: 1}", "parameter_server", "kubernetes.roles.chief: 2 chief tasks in the job"),
    ],
)
def test_role_mistakes_are_named_at_their_field(section, strategy, expected):
    assert any(expected in e for e in errors(spec_text(section, strategy))), errors(spec_text(section, strategy))


def test_roles_replace_workers_and_both_strategies_are_accepted():
    assert errors(spec_text(PS)) == []
    assert errors(spec_text("roles: {worker: 3, evaluator: 1}", "multi_worker_mirrored")) == []
    assert errors(spec_text("workers: 3", "multi_worker_mirrored")) == []  # as before


@pytest.fixture(scope="module")
def resolver_cls():
    mod = pytest.importorskip("tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver")
    return mod.TFConfigClusterResolver


def templates(docs: list[dict]) -> dict[str, dict]:
    """role -> its Job spec, from either flavour."""
    out = {}
    for doc in docs:
        if doc["kind"] == "JobSet":
            out.update({rj["name"]: rj["template"]["spec"] for rj in doc["spec"]["replicatedJobs"]})
        elif doc["kind"] == "Job":
            out[doc["metadata"]["labels"]["tfcluster/task-type"]] = doc["spec"]
    return out


@pytest.mark.parametrize("flavor", FLAVORS)
def test_one_job_per_role_valid_and_every_pods_tf_config_through_tensorflow(flavor, resolver_cls, monkeypatch):
    pytest.importorskip("kubernetes_validate")
    from orchestrator.schedulers.kubernetes.validate import validate_manifests

    spec = with_flavor(load_spec_text(spec_text(PS), "s.yaml").spec, flavor)
    plan = kubernetes_plan(spec, run_id="r1")
    assert [str(n.task) for n in plan.nodes] == ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1", "evaluator:0"]
    docs = workload(spec, plan)
    assert validate_manifests(docs) == []
    jobs = templates(docs)
    assert list(jobs) == ["chief", "worker", "ps", "evaluator"]
    assert {r: j["completions"] for r, j in jobs.items()} == {"chief": 1, "worker": 2, "ps": 2, "evaluator": 1}
    gpus = {
        r: j["template"]["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu")
        for r, j in jobs.items()
    }
    assert gpus == {"chief": "1", "worker": "1", "ps": None, "evaluator": "1"}
    assert "ports" not in jobs["evaluator"]["template"]["spec"]["containers"][0]  # no TF server
    job_of = (lambda r: f"psk-{r}-0") if flavor == "jobset" else (lambda r: f"psk-{r}")
    cluster = {
        "chief": [f"{job_of('chief')}-0.psk:2222"],
        "worker": [f"{job_of('worker')}-{i}.psk:2222" for i in range(2)],
        "ps": [f"{job_of('ps')}-{i}.psk:2222" for i in range(2)],
    }
    for node in plan.nodes:
        c = jobs[node.task.type]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        env |= {"JOB_COMPLETION_INDEX": str(node.task.index), "TFCLUSTER_ATTEMPT": "0"}
        config = pod_node_config(c["args"], env)  # what worker_entry computes in that pod
        tf_config = child_env(config, base={})["TF_CONFIG"]  # what it gives the command
        assert json.loads(tf_config) == node.tf_config
        assert (config.task.type, config.task.index, config.tf_port) == (
            node.task.type,
            node.task.index,
            node.tf_port or None,
        )
        monkeypatch.setenv("TF_CONFIG", tf_config)
        r = resolver_cls()
        assert r.cluster_spec().as_dict() == cluster  # the evaluator is in no list
        assert (r.task_type, r.task_id) == (node.task.type, node.task.index)
        assert config.env["TFCLUSTER_IS_CHIEF"] == ("1" if node.task.type == "chief" else "0")
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX=1 but the job has 1 evaluator task"):
        c = jobs["evaluator"]["template"]["spec"]["containers"][0]
        pod_node_config(
            c["args"], {e["name"]: e["value"] for e in c["env"] if "value" in e} | {"JOB_COMPLETION_INDEX": "1"}
        )


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_cli_renders_the_ps_example_and_both_validators_accept_it(flavor, capsys):
    pytest.importorskip("kubernetes_validate")
    from orchestrator.cli.main import main
    from orchestrator.schedulers.kubernetes.validate import validate_manifests

    assert main(["render", str(REPO / "cluster_specs" / "k8s-ps.yaml"), "--flavor", flavor, "--validate"]) == 0
    out, err = capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert validate_manifests(docs) == [] and "valid for Kubernetes" in err
    assert out.startswith("# ps-jobset: parameter_server: chief:1 worker:4 ps:2 as ")
    assert set(templates(docs)) == {"chief", "worker", "ps"}


def test_failure_and_success_policies_follow_the_role_table():
    """A ps or the chief failing fails its Job (the JobSet restarts all); a PS worker's pod is replaced
    by its Job (same index) and never fails the JobSet; the evaluator's failures are ignored by its Job;
    the JobSet succeeds with its training roles: the chief (PS), chief and workers (MWMS)."""
    spec = load_spec_text(spec_text(PS, restart={"max_task_restarts": 2, "max_restarts": 1}), "s.yaml").spec
    (js,) = workload(spec, kubernetes_plan(spec, run_id="r1"))
    jobs = templates([js])
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 1, "restartStrategy": "Recreate"}
    assert jobs["chief"]["backoffLimit"] == 0 and jobs["ps"]["backoffLimit"] == 0
    assert (jobs["worker"]["backoffLimitPerIndex"], jobs["worker"]["maxFailedIndexes"]) == (2, 0)
    assert jobs["worker"]["podReplacementPolicy"] == "Failed"  # one pod per hostname at a time
    assert "backoffLimit" not in jobs["worker"]
    rules = jobs["evaluator"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "tensorflow", "operator": "NotIn", "values": [0]},
    }
    mwms = load_spec_text(
        spec_text("roles: {chief: 1, worker: 2, evaluator: 1}", "multi_worker_mirrored"), "s.yaml"
    ).spec
    (js,) = workload(mwms, kubernetes_plan(mwms, run_id="r1"))
    assert js["spec"]["successPolicy"]["targetReplicatedJobs"] == ["chief", "worker"]
    assert [j["backoffLimit"] for j in templates([js]).values()] == [0, 0, 0]
    plain = load_spec_text(spec_text("workers: 2", "multi_worker_mirrored"), "s.yaml").spec
    (js,) = workload(plain, kubernetes_plan(plain, run_id="r1"))
    assert "successPolicy" not in js["spec"]  # as before: every Job completes


# --- FAKE TIER: launch ----------------------------------------------------------------------------


def launch(
    tmp_path,
    cluster: FakeCluster,
    flavor: str = "jobset",
    roles: str = "roles: {chief: 1, worker: 2, ps: 1}",
    strategy: str = "parameter_server",
    task_restarts: int = 2,
):
    text = spec_text(roles, strategy)
    doc = yaml.safe_load(text)
    doc["kubernetes"]["flavor"] = flavor
    doc["job"].update({"startup_timeout_s": 20, "stop_grace_s": 1})
    doc["heartbeat"] = {"interval_s": 0.2, "timeout_s": 30, "progress_timeout_s": None}
    doc["restart"] = {"max_restarts": 0, "max_task_restarts": task_restarts}
    loaded = load_spec_text(yaml.safe_dump(doc), "fake.yaml")
    plan = kubernetes_plan(loaded.spec, run_id="fake-1")
    backend = KubernetesBackend(
        loaded.spec, plan, KubeApi(cluster.core, cluster.batch, cluster.custom, "ml"), poll_s=0.05
    )
    opts = LaunchOptions(run_dir=str(tmp_path / "run"), live=False, echo_logs=False)
    return Job(loaded, plan, opts, backend).run(), RunDir(tmp_path / "run")


def _fail(cluster: FakeCluster, pod: dict, text: str) -> None:
    name = pod["metadata"]["name"]
    cluster.append(name, text.encode(), exited_line(1))
    cluster.end_pod(name, "status-error.json")


def when(run_dir, seen, then) -> None:
    """Call ``then`` once ``seen(events)`` holds for the launcher's events.jsonl."""

    def wait() -> None:
        wait_for(lambda: seen(jsonl(run_dir / "events.jsonl")), 30, "the launcher's events to say so", interval=0.05)
        then()

    threading.Thread(target=wait, daemon=True).start()


def starts(events: list[dict], task: str) -> int:
    return sum(e.get("event") == "task_started" and e.get("task") == task for e in events)


def when_running(run_dir, task: str, then) -> None:
    """Call ``then`` once the launcher says ``task`` runs (its go came): a PS worker failing before the
    go is a start failure, not one to restart."""
    when(run_dir, lambda evs: starts(evs, task) >= 1, then)


def when_reported(run_dir, then, started: int = 0) -> None:
    """Call ``then`` once the launcher reported a role's failure (and, with ``started``, once the
    evaluator started that many times)."""
    when(
        run_dir,
        lambda evs: any(e.get("event") == "role_failure" for e in evs) and starts(evs, "evaluator:0") >= started,
        then,
    )


class ListedAtOnce(FakeCluster):
    """The launcher's watch lists the pods right after each one ended (what a loaded machine may make of
    its 0.25 s poll): the controllers' reactions to the end — a replacement pod — start at once."""

    def end_pod(self, pod: str, status_file: str, exit_code: int | None = None) -> None:
        super().end_pod(pod, status_file, exit_code)
        self.advance()


@pytest.mark.parametrize(
    ("flavor", "cluster_type"), [(f, FakeCluster) for f in FLAVORS] + [("indexed-job", ListedAtOnce)]
)
def test_a_ps_worker_pod_that_dies_is_restarted_in_place_and_the_job_succeeds_with_the_chief(
    tmp_path, flavor, cluster_type
):
    seen: list[str] = []  # every pod whose container started, as "task pod"
    ran: list[str] = []  # worker:1's pods that had started when the chief ended

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        task, name = pod["_task"], pod["metadata"]["name"]
        seen.append(f"{task} {name}")
        if task == "worker:1" and sum(s.startswith("worker:1 ") for s in seen) == 1:
            cluster.append(name, *started_lines(task, "worker:1 up\n"))
            when_running(tmp_path / "run", task, lambda: _fail(cluster, pod, "worker:1 lost its GPU\n"))
        elif task == "worker:1":  # the replacement: once it runs, the coordinator finishes
            cluster.append(name, *started_lines(task, "worker:1 is back\n"))
            chief = next(p for p in cluster.pods.values() if p["_task"] == "chief:0")

            def finish() -> None:
                ran.extend(s.split()[1] for s in seen if s.startswith("worker:1 "))  # before the job's end
                cluster.append(chief["metadata"]["name"], b"chief: done\n", exited_line(0))
                cluster.end_pod(chief["metadata"]["name"], "status-succeeded.json")

            threading.Timer(1.0, finish).start()
        else:
            cluster.append(name, *started_lines(task, f"{task} up\n"))

    cluster = cluster_type(behaviour=behaviour)
    result, run = launch(tmp_path, cluster, flavor)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert exit_code_for(result) == 0
    # While the job ran, worker:1 had two pods: the first and its Job's replacement (the same completion
    # index, so the same hostname: <job>-1), and the launcher followed both. The teardown deletes the pods
    # still running; an Indexed Job's controller replaces a deleted pod while the index has restarts left
    # (as a real one does), and that pod may start before close() deletes the Job, if the launcher's watch
    # lists the pods in between: it is no restart, and the launcher never follows it.
    assert len(ran) == 2 and ran[0] != ran[1] and ran[1].rsplit("-", 1)[0] == ran[0].rsplit("-", 1)[0], seen
    events = jsonl(run.path / "events.jsonl")
    assert starts(events, "worker:1") == 2 and starts(events, "worker:0") == 1, events
    assert len(result.attempts) == 1  # the job was not restarted
    assert result.tasks["chief:0"].state == TaskState.SUCCEEDED
    text = run.task_log("worker-1", 0).read_text()
    assert text.index("worker:1 lost its GPU") < text.index("worker:1 is back")  # both incarnations, in order
    restarts = [e for e in events if e.get("event") == "role_failure"]
    assert [(e["task"], e["action"], e["restarts"]) for e in restarts] == [("worker:1", "restart", 1)]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_ps_pod_that_dies_ends_the_job_with_the_ps_as_root_cause(tmp_path, flavor):
    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        if pod["_task"] == "ps:0":
            cluster.append(pod["metadata"]["name"], *started_lines("ps:0", "ps:0 up\n"))
            when_running(tmp_path / "run", "ps:0", lambda: _fail(cluster, pod, "ps:0: out of memory\n"))
        else:
            cluster.append(pod["metadata"]["name"], *started_lines(pod["_task"], "up\n"))

    cluster = FakeCluster(behaviour=behaviour)
    result, _ = launch(tmp_path, cluster, flavor)
    assert result.state == JobState.FAILED and exit_code_for(result) == 3
    assert result.root_cause.task == "ps:0" and result.root_cause.exit_code == 1
    assert result.tasks["ps:0"].state == TaskState.FAILED
    assert all(result.tasks[t].state == TaskState.STOPPED for t in ("chief:0", "worker:0", "worker:1"))
    assert not cluster.objects  # close() deleted what it applied


@pytest.mark.parametrize("task_restarts", [2, 0])
def test_a_sidecar_evaluator_that_dies_is_followed_to_its_replacement_and_the_mwms_training_succeeds(
    tmp_path, task_restarts
):
    """Its Job ignores its failure (podFailurePolicy), so the JobSet never restarts the training, and puts
    a new pod in its place, which the launcher follows as the evaluator's restart (within
    ``restart.max_task_restarts``; beyond, the failure is only reported)."""

    def behaviour(cluster: FakeCluster, pod: dict) -> None:
        task, name = pod["_task"], pod["metadata"]["name"]
        first = not any(p["_task"] == task for p in cluster.pods.values() if p is not pod)
        cluster.append(name, *started_lines(task, f"{task} up ({'first' if first else 'replacement'})\n"))
        if task == "evaluator:0" and first:
            when_running(tmp_path / "run", task, lambda: _fail(cluster, pod, "evaluator: no checkpoint dir\n"))
        elif task != "evaluator:0":

            def done() -> None:  # once the evaluator failed (and its replacement runs, when followed), training ends
                cluster.append(name, exited_line(0))
                cluster.end_pod(name, "status-succeeded.json")

            when_reported(tmp_path / "run", done, started=2 if task_restarts else 0)

    cluster = FakeCluster(behaviour=behaviour)
    result, run = launch(
        tmp_path,
        cluster,
        roles="roles: {chief: 1, worker: 1, evaluator: 1}",
        strategy="multi_worker_mirrored",
        task_restarts=task_restarts,
    )
    assert result.state == JobState.SUCCEEDED, result.root_cause
    assert len(result.attempts) == 1 and result.tasks["chief:0"].state == TaskState.SUCCEEDED
    failures = [e for e in jsonl(run.path / "events.jsonl") if e.get("event") == "role_failure"]
    log = run.task_log("evaluator-0", 0).read_text()
    if task_restarts:
        assert [(e["task"], e["action"], e["restarts"]) for e in failures] == [("evaluator:0", "restart", 1)]
        # its replacement ran until the training ended, then was stopped with the job
        assert result.tasks["evaluator:0"].state == TaskState.STOPPED
        assert log.index("evaluator: no checkpoint dir") < log.index("evaluator:0 up (replacement)")
    else:
        assert [(e["task"], e["action"]) for e in failures] == [("evaluator:0", "report")]
        assert "its replacements are not followed" in failures[0]["message"]
        assert result.tasks["evaluator:0"].state == TaskState.FAILED
        assert "(replacement)" not in log
