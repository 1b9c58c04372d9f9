"""Render a Kubernetes plan as manifests a user can ``kubectl apply``: a JobSet, or Indexed Jobs + a
headless Service. Pure: the same spec and plan give the same documents.

Every pod runs ``python -m worker_entry kubernetes -- COMMAND`` with the plan's environment; what
differs per pod (TF_CONFIG, task index, chief) worker_entry derives from ``JOB_COMPLETION_INDEX`` and
the cluster in ``TFCLUSTER_POD``. The restart attempt comes through the downward API: the JobSet's
``restart-attempt`` annotation, or tfcluster's own for an Indexed Job relaunched by ``launch``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import yaml

from worker_entry.protocol import Env
from worker_entry.protocol.podlog import PodConfig
from worker_entry.protocol.roles import ROLES

from ...plan import NodePlan, Plan
from ...plan.roles import rule_of
from ...spec import ClusterSpec
from .plan import POD_DIR, PodNames, pod_names
from .secrets import Credentials, container_args, container_env, credentials, env_from, escape, secret_doc

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
CONTAINER = "tensorflow"
LABEL_JOB = "tfcluster/job"
LABEL_TASK_TYPE = "tfcluster/task-type"
ANNOTATION_RUN_ID = "tfcluster/run-id"
ANNOTATION_ATTEMPT = "tfcluster/attempt"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tfcluster"}
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: What worker_entry computes in the pod (it differs per pod of one template).
PER_POD_ENV = frozenset({Env.TF_CONFIG, Env.TASK_INDEX, Env.IS_CHIEF})
#: Seconds the kubelet waits after SIGTERM beyond worker_entry's own grace (drain the log, report).
TERMINATION_MARGIN_S = 15
PORT_NAME = "tf-grpc"


def render(spec: ClusterSpec, plan: Plan, attempt: int = 0, avoid_nodes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The objects to create, in order: the credentials' Secret (if any) and the Service before the Jobs
    that use them. ``avoid_nodes``: Indexed Jobs of a restart keep off these nodes (a required node
    affinity on the node's name): those the launcher found unresponsive (``stuck``)."""
    k8s = spec.kubernetes
    assert k8s is not None and plan.scheduler == "kubernetes"
    names = pod_names(spec)
    creds = credentials(spec)
    types = [t for t in ROLES if any(n.task.type == t for n in plan.nodes)]
    first = [secret_doc(creds, _meta(spec, creds.secret, plan))] if creds else []
    if k8s.network_policy:  # before any pod exists: no moment when the TF port is open to the cluster
        first.append(_network_policy(spec, plan))
    if k8s.flavor == "jobset":
        return [*first, _jobset(spec, plan, names, types, creds)]
    jobs = [_job(spec, plan, names, t, attempt, creds, avoid_nodes) for t in types]
    return [*first, _service(spec, names, plan), *jobs]


def with_flavor(spec: ClusterSpec, flavor: str | None) -> ClusterSpec:
    """The spec with ``kubernetes.flavor`` overridden (``tfcluster render --flavor``)."""
    if not flavor or spec.kubernetes is None or spec.kubernetes.flavor == flavor:
        return spec
    return spec.model_copy(update={"kubernetes": spec.kubernetes.model_copy(update={"flavor": flavor})})


def to_yaml(docs: list[dict[str, Any]], header: str = "") -> str:
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=1000)


def _meta(spec: ClusterSpec, name: str, plan: Plan, **extra_labels: str) -> dict[str, Any]:
    k8s = spec.kubernetes
    assert k8s is not None
    return {
        "name": name,
        "namespace": k8s.namespace,
        "labels": {LABEL_JOB: spec.name, **MANAGED_BY, **extra_labels},
        "annotations": {ANNOTATION_RUN_ID: plan.run_id},
    }


def _service(spec: ClusterSpec, names: PodNames, plan: Plan) -> dict[str, Any]:
    """Headless: DNS records per pod, published before readiness (MWMS dials its peers at start)."""
    port = spec.tensorflow.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, names.service, plan),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: spec.name},
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def _network_policy(spec: ClusterSpec, plan: Plan) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods (every port: the TF port, where TF's gRPC
    server runs any client's ops, and NCCL's sockets between them), from nowhere else."""
    job = {"matchLabels": {LABEL_JOB: spec.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec, spec.name, plan),
        "spec": {"podSelector": job, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": job}]}]},
    }


def _job(
    spec: ClusterSpec,
    plan: Plan,
    names: PodNames,
    task_type: str,
    attempt: int,
    creds: Credentials,
    avoid_nodes: tuple[str, ...] = (),
) -> dict[str, Any]:
    job_spec = _job_spec(spec, plan, task_type, attempt, creds)
    job_spec["template"]["spec"]["subdomain"] = names.service
    if avoid_nodes:
        job_spec["template"]["spec"]["affinity"] = _keep_off(avoid_nodes)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(spec, names.job_name(task_type), plan, **{LABEL_TASK_TYPE: task_type}),
        "spec": job_spec,
    }


def _jobset(spec: ClusterSpec, plan: Plan, names: PodNames, types: list[str], creds: Credentials) -> dict[str, Any]:
    js: dict[str, Any] = {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _meta(spec, names.name, plan),
        "spec": {
            # Pod hostnames <jobset>-<replicated job>-<job index>-<pod index> under the Service <subdomain>.
            "network": {"enableDNSHostnames": True, "subdomain": names.service, "publishNotReadyAddresses": True},
            # A fatal role's pod failing fails its Job (backoffLimit 0), which restarts *every* Job: MWMS and
            # a PS job's chief/ps restart whole. A PS worker or an evaluator never fails its Job (_failure_limits).
            # Recreate (v0.12's default, said explicitly): a restart deletes every child Job and makes it again,
            # each once its old pods are gone; not BlockingRecreate, which waits for all of them first. A pod
            # stuck on a dead node would hold its Job back: the launcher force-deletes it (stuck.py).
            "failurePolicy": {"maxRestarts": spec.restart.max_restarts, "restartStrategy": "Recreate"},
            "replicatedJobs": [
                {
                    "name": names.replicated_job(t),
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {LABEL_TASK_TYPE: t}},
                        "spec": _job_spec(spec, plan, t, None, creds),
                    },
                }
                for t in types
            ],
        },
    }
    if plan.has_roles:
        # The job is done when its training roles completed (PS: the chief; MWMS: chief and workers, not the
        # evaluator); the JobSet controller then deletes the Jobs still running (ps, workers, the evaluator).
        trains = [t for t in types if rule_of(plan.strategy, t).trains]
        js["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": trains}
    return js


def _job_spec(spec: ClusterSpec, plan: Plan, task_type: str, attempt: int | None, creds: Credentials) -> dict[str, Any]:
    """An Indexed Job of every pod of one task type; ``attempt`` None: the JobSet counts attempts."""
    nodes = [n for n in plan.nodes if n.task.type == task_type]
    annotations = {ANNOTATION_RUN_ID: plan.run_id}
    if attempt is not None:
        annotations[ANNOTATION_ATTEMPT] = str(attempt)
    return {
        "completionMode": "Indexed",
        "completions": len(nodes),
        "parallelism": len(nodes),
        **_failure_limits(spec, plan.strategy, task_type),
        "template": {
            "metadata": {
                "labels": {LABEL_JOB: spec.name, LABEL_TASK_TYPE: task_type, **MANAGED_BY},
                "annotations": annotations,
            },
            "spec": _pod_spec(spec, nodes[0], JOBSET_RESTART_ATTEMPT if attempt is None else ANNOTATION_ATTEMPT, creds),
        },
    }


def _keep_off(nodes: tuple[str, ...]) -> dict[str, Any]:
    """A required node affinity: not on these nodes (by name: ``matchFields`` on ``metadata.name``,
    which is what a pod's ``spec.nodeName`` holds; the hostname label may differ from it)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _failure_limits(spec: ClusterSpec, strategy: str, task_type: str) -> dict[str, Any]:
    """What one failed pod does to its Job, after ``plan.roles``' table:

    - teardown (MWMS members, a PS chief or ps): backoffLimit 0, the Job fails, the JobSet restarts all;
    - restart (a PS worker): the Job controller replaces the failed pod with one of the same completion
      index, so the same hostname and TF_CONFIG entry (``backoffLimitPerIndex``, per task like
      ``restart.max_task_restarts``); once one index has failed that often the Job fails (``maxFailedIndexes: 0``);
    - report (the sidecar evaluator): its failures never fail its Job (``podFailurePolicy`` Ignore: the
      Job controller starts it again, uncounted), so they never restart the training. JobSet's own
      per-Job restart actions (RestartJob) are alpha, off by default in v0.12, so they are not used.
    """
    on_failure = rule_of(strategy, task_type).on_failure
    if on_failure == "restart":
        # podReplacementPolicy Failed: the new pod only once the old one is gone, never two pods (two DNS
        # records) for one hostname
        return {
            "backoffLimitPerIndex": spec.restart.max_task_restarts,
            "maxFailedIndexes": 0,
            "podReplacementPolicy": "Failed",
        }
    if on_failure == "report":
        return {
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]},
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
        }
    return {"backoffLimit": 0}  # one failed pod fails the whole Job: MWMS cannot go on without a member


def pod_config(spec: ClusterSpec, node: NodePlan) -> PodConfig:
    """``TFCLUSTER_POD`` of a task type's pods (the same for every pod of the type): the NodeConfig the
    plan builds for its first task, without what the pod has elsewhere (the environment is the
    container's, the command its args) or never uses (no hand-over: no checkpoint listing or cleaning)."""
    k8s = spec.kubernetes
    assert k8s is not None
    config = dataclasses.replace(
        node.node_config(0, wait_for_go=False), argv=[], env={}, checkpoint_dir=None, clean_dirs=[]
    )
    return PodConfig(
        config=config,
        remote_dir=POD_DIR,
        # an evaluator is outside the cluster: how many there are says which completion indexes are valid
        tasks=None if node.task.type in node.common.cluster else (k8s.roles or {}).get(node.task.type, 1),
    )


def _pod_spec(spec: ClusterSpec, node: NodePlan, attempt_source: str, creds: Credentials) -> dict[str, Any]:
    k8s = spec.kubernetes
    assert k8s is not None
    env = container_env({k: v for k, v in node.env.items() if k not in PER_POD_ENV}, creds)
    env.append({"name": Env.POD, "value": escape(json.dumps(pod_config(spec, node).to_dict(), separators=(",", ":")))})
    env.append(
        {"name": Env.ATTEMPT, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{attempt_source}']"}}}
    )
    mounts = [{"name": "tfcluster", "mountPath": POD_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "tfcluster", "emptyDir": {}}]
    if k8s.volume is not None:
        mounts.append({"name": "checkpoints", "mountPath": k8s.volume.mount_path})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": k8s.volume.claim_name}})
    if node.gpus:  # NCCL and TF need more shared memory than the runtime's 64 MiB default
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": k8s.image,
        "command": [escape(a) for a in (*node.argv, "--")],
        "args": container_args(list(node.command), creds),
        "env": env,
        "resources": _resources(spec, node.gpus),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if node.tf_port:  # an evaluator runs no TF server
        container["ports"] = [{"name": PORT_NAME, "containerPort": node.tf_port, "protocol": "TCP"}]
    if k8s.env_secret:
        container["envFrom"] = env_from(spec)
    if node.workdir:
        container["workingDir"] = node.workdir
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # a failed task fails its Job; the JobSet (or launch) restarts all
        # SIGTERM → worker_entry's grace for the training process → its exit report, then SIGKILL.
        "terminationGracePeriodSeconds": math.ceil(spec.job.stop_grace_s) + TERMINATION_MARGIN_S,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
    }
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    else:
        pod["automountServiceAccountToken"] = False  # the pods never call the API
    if k8s.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in k8s.image_pull_secrets]
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        pod["tolerations"] = [_toleration(t) for t in k8s.tolerations]
    return pod


def _resources(spec: ClusterSpec, gpus: int) -> dict[str, Any]:
    k8s = spec.kubernetes
    assert k8s is not None
    requests = {k: v for k, v in (("cpu", k8s.requests.cpu), ("memory", k8s.requests.memory)) if v is not None}
    limits: dict[str, Any] = {
        k: v for k, v in (("cpu", k8s.limits.cpu), ("memory", k8s.limits.memory)) if v is not None
    }
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _toleration(t: Any) -> dict[str, Any]:
    out = {
        "key": t.key,
        "operator": t.operator,
        "value": t.value,
        "effect": t.effect,
        "tolerationSeconds": t.toleration_seconds,
    }
    return {k: v for k, v in out.items() if v is not None}
