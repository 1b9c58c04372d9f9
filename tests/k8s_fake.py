"""FAKE TIER — a stand-in for the Kubernetes API, not a cluster and not an API server.

``FakeCluster`` answers exactly the calls ``orchestrator.schedulers.kubernetes.api.KubeApi`` makes on
the official client's ``CoreV1Api``, ``BatchV1Api`` and ``CustomObjectsApi`` (same method names and
argument shapes; ``ACCEPTED`` lists the keyword arguments, which ``test_k8s_launch.py`` checks against
the real client when it is installed). Bodies come from ``tests/k8s_recorded/`` (API-shaped JSON; see
its README): pods are built from ``pod.json`` and the ``status-*.json`` files, errors carry recorded
``Status`` bodies. A tiny controller mimics what the JobSet and Job controllers and the kubelet do
for tfcluster's renderings: pods per completion index with the labels and annotations the real
controllers set, a failed pod failing its Job — or replaced, same index, when its Job has
``backoffLimitPerIndex`` left or a ``podFailurePolicy`` Ignore rule matches its exit code — a JobSet
restarting every pod (``maxRestarts``) or failing, completing by its ``successPolicy`` (the pods still
running then get SIGTERM), a deleted pod getting SIGTERM. What a pod prints is scripted by the test in worker_entry's
pod-log format (``worker_entry.protocol.podlog``).

Nothing here proves how a real cluster behaves; it proves how the launcher handles these shapes.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

# the client's faces and the pod-log lines live in k8s_fake_api; the tests import every name from here
from k8s_fake_api import (  # noqa: F401
    ACCEPTED,
    RECORDED,
    FakeApiException,
    FakeLog,
    FakeResponse,
    _Batch,
    _Core,
    _Custom,
    exited_line,
    hello,
    msg_line,
    recorded,
    started_lines,
)

from worker_entry import protocol as p


def workload(spec: Any, plan: Any, attempt: int = 0) -> list[dict[str, Any]]:
    """The rendering without its NetworkPolicy (tested on its own: test_hostile_round3_k8s.py)."""
    from orchestrator.schedulers.kubernetes import render

    return [d for d in render(spec, plan, attempt) if d["kind"] != "NetworkPolicy"]


# --- the fake cluster ----------------------------------------------------------------------------

Behaviour = Callable[["FakeCluster", dict[str, Any]], None]


class FakeCluster:
    """Objects, pods and pod logs of one namespace, and the controllers' reactions."""

    def __init__(self, namespace: str = "ml", behaviour: Behaviour | None = None) -> None:
        self.ns = namespace
        self.behaviour = behaviour or (lambda c, pod: None)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, list[tuple[float, bytes]]] = {}
        self.ended: set[str] = set()
        self.calls: list[tuple[str, tuple, dict]] = []
        self.created: list[dict[str, Any]] = []  # every body a create call got, in order
        self.errors: dict[str, FakeApiException] = {}  # method -> raise this
        self.start_state: dict[str, str] = {}  # task -> recorded status file for a pod that never runs
        self.drop_log_after: dict[str, int] = {}  # pod prefix -> cut the followed stream after N lines, once
        self.index_failures: dict[tuple[str, str, str], int] = {}  # (job, attempt, index) -> failed pods
        self.replaced: set[str] = set()  # failed pods their Job started again
        self.reconcile: list[Callable[[], None]] = []  # what the controllers do at their next reconcile
        self.node_of: dict[str, str] = {}  # task -> the node its next pod is bound to (spec.nodeName)
        # nodes whose kubelet no longer answers: a pod there, once deleted, stays Terminating until it
        # is force-deleted (gracePeriodSeconds 0), and its Job deleted in the foreground stays with it
        self.dead_nodes: set[str] = set()
        self.cond = threading.Condition(threading.RLock())
        self._ids = itertools.count()
        self.core, self.batch, self.custom = _Core(self), _Batch(self), _Custom(self)

    # --- bookkeeping ---------------------------------------------------------------------------

    def call(self, method: str, args: tuple, kwargs: dict) -> None:
        unknown = set(kwargs) - ACCEPTED[method]
        assert not unknown, f"{method}: unexpected keyword arguments {unknown}"
        assert kwargs.get("_preload_content") is False, f"{method}: the backend must read raw JSON"
        self.calls.append((method, args, kwargs))
        if method in self.errors:
            raise self.errors[method]

    def called(self, method: str) -> list[tuple[tuple, dict]]:
        return [(a, k) for m, a, k in self.calls if m == method]

    def store(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A created object as the API server keeps it: with the uid it assigned."""
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = str(uuid.uuid4())
        self.objects[(kind, obj["metadata"]["name"])] = obj
        return obj

    def precondition(self, kind: str, name: str, kw: dict) -> None:
        """A delete's ``preconditions.uid``: the API server refuses (409) when the object's differs."""
        want = ((kw.get("body") or {}).get("preconditions") or {}).get("uid")
        have = ((self.objects.get((kind, name)) or {}).get("metadata") or {}).get("uid")
        if want is not None and have is not None and want != have:
            body = recorded("status-409.json") | {"message": f"Precondition failed: UID in precondition: {want}"}
            raise FakeApiException(409, body)

    def forge_pod(self, name: str, task: str, attempt: int = 0, owner: dict | None = None) -> None:
        """A pod someone created by hand with the job's labels and annotations (not by its Job)."""
        with self.cond:
            like = next(p for p in self.pods.values() if p["_task"] == task)
            pod = copy.deepcopy(like)
            pod["metadata"]["name"] = name
            pod["metadata"]["uid"] = str(uuid.uuid4())
            pod["metadata"]["ownerReferences"] = [owner] if owner else []
            pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = str(attempt)
            pod["status"] = recorded("status-running.json")
            self.pods[name] = pod
            self.logs[name] = []
            self.cond.notify_all()

    def not_found(self, name: str) -> FakeApiException:
        body = recorded("status-404.json")
        body["message"] = body["message"].replace("PLACEHOLDER", name)
        return FakeApiException(404, body)

    # --- pods and logs -------------------------------------------------------------------------

    def append(self, pod: str, *lines: bytes) -> None:
        with self.cond:
            for line in lines:
                for part in line.splitlines(keepends=True):
                    self.logs.setdefault(pod, []).append((time.time(), part))
            self.cond.notify_all()

    def end_pod(self, pod: str, status_file: str, exit_code: int | None = None) -> None:
        """The container ended: the status from ``status_file`` (exit code overridable); the log ends."""
        with self.cond:
            obj = self.pods.get(pod)
            if obj is None or pod in self.ended:
                return
            status = recorded(status_file)
            if exit_code is not None:
                status["containerStatuses"][0]["state"]["terminated"]["exitCode"] = exit_code
            obj["status"] = status
            self.ended.add(pod)
            self.cond.notify_all()
            self._react(obj)

    def sigterm(self, pod: str, grace_s: int | None = None) -> None:
        """The kubelet's SIGTERM: worker_entry stops the task and reports (what it prints on it). On a
        dead node nothing happens but the deletion's mark (the shortest grace asked so far)."""
        with self.cond:
            obj = self.pods.get(pod)
            if obj is None or pod in self.ended:
                return
            if self.stuck(obj):
                meta = obj["metadata"]
                grace = obj["spec"].get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s
                meta["deletionGracePeriodSeconds"] = min(grace, meta.get("deletionGracePeriodSeconds", grace))
                meta.setdefault("deletionTimestamp", "2026-11-23T10:04:00Z")
                return
            obj["metadata"]["deletionTimestamp"] = "2026-11-23T10:04:00Z"
            if obj["status"].get("phase") == "Running":
                self.append(pod, msg_line(p.Stopping(reason="worker_entry received SIGTERM")))
                self.append(pod, exited_line(None, 15, True, "worker_entry received SIGTERM"))
                self.end_pod(pod, "status-error.json", exit_code=143)
            else:
                self.ended.add(pod)
                self.pods.pop(pod, None)
                self.cond.notify_all()

    def stuck(self, pod: dict[str, Any]) -> bool:
        """On a dead node: nothing there will ever end it."""
        return pod["spec"].get("nodeName") in self.dead_nodes

    def force_delete(self, pod: str) -> None:
        """``gracePeriodSeconds: 0``: the API server removes the pod without waiting for its kubelet."""
        with self.cond:
            self.pods.pop(pod, None)
            self.ended.add(pod)
            for key, job in list(self.objects.items()):  # a Job deleted in the foreground goes with its last pod
                left = [p for p in self.pods_of(**{"job-name": key[1]}) if p["metadata"]["name"] not in self.ended]
                if key[0] == "Job" and job["metadata"].get("deletionTimestamp") and not left:
                    del self.objects[key]
            self.cond.notify_all()

    def pods_of(self, **labels: str) -> list[dict[str, Any]]:
        return [
            pod for pod in self.pods.values() if all(pod["metadata"]["labels"].get(k) == v for k, v in labels.items())
        ]

    def _new_pod(self, job: str, template: dict[str, Any], index: int, extra: dict[str, str], subdomain: str) -> None:
        pod = recorded("pod.json")
        name = f"{job}-{index}-{next(self._ids):05d}"
        meta = pod["metadata"]
        meta["name"], meta["generateName"], meta["namespace"] = name, f"{job}-{index}-", self.ns
        meta["labels"].update({"job-name": job, "batch.kubernetes.io/job-name": job})
        meta["labels"].update(template["metadata"].get("labels") or {})
        meta["labels"].update(extra)
        meta["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
        meta["annotations"] = dict(template["metadata"].get("annotations") or {})
        meta["annotations"].update(extra)
        meta["annotations"]["batch.kubernetes.io/job-completion-index"] = str(index)
        meta["ownerReferences"][0]["name"] = job
        owner = self.objects.get(("Job", job))  # the Job controller's pods point at their Job's uid
        meta["ownerReferences"][0]["uid"] = owner["metadata"]["uid"] if owner else "no-such-job"
        meta["uid"] = str(uuid.uuid4())
        pod["spec"]["hostname"], pod["spec"]["subdomain"] = f"{job}-{index}", subdomain
        task = f"{meta['labels'].get('tfcluster/task-type')}:{index}"
        if task in self.node_of:
            pod["spec"]["nodeName"] = self.node_of.pop(task)
        pod["status"] = recorded(self.start_state.get(task, "status-pending-creating.json"))
        pod["_task"] = task
        self.pods[name] = pod
        self.logs[name] = []

    def advance(self) -> None:
        """Pods waiting for their container start (the kubelet got to them); their scripts run."""
        with self.cond:
            todo, self.reconcile = self.reconcile, []
            for step in todo:
                step()
            for name, pod in list(self.pods.items()):
                if pod["_task"] in self.start_state or name in self.ended:
                    continue
                if pod["status"].get("phase") == "Pending":
                    pod["status"] = recorded("status-running.json")
                    self.behaviour(self, pod)

    # --- controllers ---------------------------------------------------------------------------

    def create_jobset(self, body: dict[str, Any]) -> None:
        body = copy.deepcopy(body)
        body["metadata"].setdefault("uid", str(uuid.uuid4()))
        body["status"] = recorded("jobset-status-running.json")
        self.objects[("JobSet", body["metadata"]["name"])] = body
        self._jobset_pods(body, 0)

    def _jobset_pods(self, js: dict[str, Any], attempt: int) -> None:
        name = js["metadata"]["name"]
        for rj in js["spec"]["replicatedJobs"]:
            job = f"{name}-{rj['name']}-0"
            extra = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                "jobset.sigs.k8s.io/job-index": "0",
                "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            }
            template = rj["template"]["spec"]["template"]
            # the JobSet controller's Job (made again, new uid, for each restart), controlled by the JobSet
            ref = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "controller": True}
            self.objects[("Job", job)] = {
                "kind": "Job",
                "metadata": {
                    "name": job,
                    "uid": str(uuid.uuid4()),
                    "labels": dict(extra),
                    "ownerReferences": [{**ref, "uid": js["metadata"]["uid"]}],
                },
                "spec": rj["template"]["spec"],
                "status": {},
                "_jobset": name,
            }
            for i in range(rj["template"]["spec"]["completions"]):
                self._new_pod(job, template, i, extra, js["spec"]["network"]["subdomain"])

    def _recreate(self, js: dict[str, Any], old: list[dict[str, Any]]) -> None:
        """restartStrategy Recreate with foreground deletion: the new pods once the old ones are gone
        (a real controller waits per child Job; the fake waits for all of them)."""
        if any(p["metadata"]["name"] in self.pods and p["metadata"]["name"] not in self.ended for p in old):
            self.reconcile.append(lambda: self._recreate(js, old))
            return
        self._jobset_pods(js, js["status"]["restarts"])

    def create_job(self, body: dict[str, Any]) -> None:
        body = copy.deepcopy(body)
        body["metadata"].setdefault("uid", str(uuid.uuid4()))
        body["status"] = {"active": body["spec"]["completions"]}
        self.objects[("Job", body["metadata"]["name"])] = body
        template = body["spec"]["template"]
        for i in range(body["spec"]["completions"]):
            self._new_pod(body["metadata"]["name"], template, i, {}, template["spec"]["subdomain"])

    def _react(self, pod: dict[str, Any]) -> None:
        """What the Job / JobSet controllers do when a pod ended."""
        labels = pod["metadata"]["labels"]
        failed = pod["status"]["phase"] == "Failed"
        js_name = labels.get("jobset.sigs.k8s.io/jobset-name")
        if js_name:
            js = self.objects.get(("JobSet", js_name))
            attempt = int(labels["jobset.sigs.k8s.io/restart-attempt"])
            if js is None or attempt != js["status"]["restarts"] or js["status"].get("terminalState"):
                return
            if failed and self._replace(pod):
                return
            peers = self.pods_of(
                **{"jobset.sigs.k8s.io/jobset-name": js_name, "jobset.sigs.k8s.io/restart-attempt": str(attempt)}
            )
            peers = [peer for peer in peers if peer["metadata"]["name"] not in self.replaced]
            if failed:
                if js["status"]["restarts"] < js["spec"]["failurePolicy"]["maxRestarts"]:
                    js["status"]["restarts"] += 1  # first: the peers' own ends are then of an old attempt
                    restart = True
                else:
                    js["status"] = recorded("jobset-status-failed.json")
                    restart = False
                for peer in peers:
                    self.sigterm(peer["metadata"]["name"])
                if restart:  # at the controller's next reconcile (the next call), as a real one does
                    self.reconcile.append(lambda js=js, old=peers: self._recreate(js, old))
            else:
                self._success_policy(js, peers)
            return
        if failed and self._replace(pod):
            return
        job = self.objects.get(("Job", labels["job-name"]))
        if job is not None and failed:
            job["status"] = recorded("job-status-failed.json")
            for peer in self.pods_of(**{"job-name": labels["job-name"]}):
                self.sigterm(peer["metadata"]["name"])

    def _success_policy(self, js: dict[str, Any], peers: list[dict[str, Any]]) -> None:
        """The JobSet completes when every pod of its target replicated jobs (all, without a
        successPolicy) succeeded; the JobSet controller then deletes the Jobs still running."""
        policy = js["spec"].get("successPolicy") or {}
        targets = policy.get("targetReplicatedJobs") or [rj["name"] for rj in js["spec"]["replicatedJobs"]]
        counted = [p for p in peers if p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] in targets]
        expected = sum(
            rj["template"]["spec"]["completions"] for rj in js["spec"]["replicatedJobs"] if rj["name"] in targets
        )
        done = [p for p in counted if p["status"]["phase"] == "Succeeded"]
        if len(done) < expected:
            return
        js["status"]["conditions"] = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]
        js["status"]["terminalState"] = "Completed"
        for peer in peers:
            self.sigterm(peer["metadata"]["name"])

    def _replace(self, pod: dict[str, Any]) -> bool:
        """The Job controller starts a failed pod's completion index again: a podFailurePolicy Ignore
        rule matched its exit code (not counted), or its index has ``backoffLimitPerIndex`` left."""
        meta, labels = pod["metadata"], pod["metadata"]["labels"]
        js_name = labels.get("jobset.sigs.k8s.io/jobset-name")
        if js_name:
            js = self.objects[("JobSet", js_name)]
            rj = next(
                r for r in js["spec"]["replicatedJobs"] if r["name"] == labels["jobset.sigs.k8s.io/replicatedjob-name"]
            )
            job_spec, extra = (
                rj["template"]["spec"],
                {k: v for k, v in labels.items() if k.startswith("jobset.sigs.k8s.io/")},
            )
        else:
            job = self.objects.get(("Job", labels["job-name"]))
            if job is None:
                return False
            job_spec, extra = job["spec"], {}
        term = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("terminated") or {}
        code = term.get("exitCode")
        rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
        ignored = any(
            r["action"] == "Ignore"
            and "onExitCodes" in r
            and r["onExitCodes"]["operator"] == "NotIn"
            and code is not None
            and code not in r["onExitCodes"]["values"]
            for r in rules
        )
        index = labels["batch.kubernetes.io/job-completion-index"]
        if not ignored:
            limit = job_spec.get("backoffLimitPerIndex")
            key = (
                labels["job-name"],
                meta["annotations"].get("tfcluster/attempt", labels.get("jobset.sigs.k8s.io/restart-attempt", "")),
                index,
            )
            self.index_failures[key] = self.index_failures.get(key, 0) + 1
            if limit is None or self.index_failures[key] > limit:
                return False
        self.replaced.add(meta["name"])
        self._new_pod(labels["job-name"], job_spec["template"], int(index), extra, pod["spec"]["subdomain"])
        return True

    def delete_owned(self, kind: str, name: str) -> None:
        with self.cond:
            obj = self.objects.pop((kind, name), None)
            if kind == "JobSet":  # its Jobs go with it
                for key in [k for k, o in self.objects.items() if o.get("_jobset") == name]:
                    del self.objects[key]
            key = "jobset.sigs.k8s.io/jobset-name" if kind == "JobSet" else "job-name"
            for pod in self.pods_of(**{key: name}):
                self.sigterm(pod["metadata"]["name"])
            left = [pod for pod in self.pods_of(**{key: name}) if self.stuck(pod)]
            if kind == "Job" and left and obj is not None:  # foreground: the Job waits for its pods
                obj["metadata"]["deletionTimestamp"] = "2026-11-23T10:05:00Z"
                self.objects[(kind, name)] = obj
