"""``tfcluster launch`` with ``scheduler: kubernetes``: apply the rendering, follow every pod, stop.

- attempt 0 creates the rendering (a JobSet, or the Service and the Indexed Jobs); a later attempt
  of a JobSet is the controller's own restart (``failurePolicy.maxRestarts``: all pods together),
  of Indexed Jobs the launcher's (the Jobs deleted, pods gone, created again with the attempt);
- each task's pod of the attempt (matched by its task-type label, completion index and attempt)
  becomes a ``PodChannel`` as soon as its container runs; a pod that cannot start (image, config)
  or is not running by the startup deadline is a start failure naming the pod's own reason;
- the supervisor's stop deletes that pod; ``close()`` deletes what the launcher applied;
- a task restarted alone, in place (a parameter-server worker, ``restart_task``): its Job's controller
  replaces the failed pod with one of the same completion index (``backoffLimitPerIndex`` in the
  rendering), so the same hostname and TF_CONFIG entry; the launcher follows that new pod;
- ``RUN/kubernetes.json`` records the objects and every pod's phase, node and exit (``status``
  shows it; ``stop`` deletes the objects when the launcher is gone).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from worker_entry.protocol import NodeConfig

from ...backends.backend import Backend, Deliver, Placement
from ...backends.base import Channel
from ...core.diagnostics import Diagnostic
from ...plan import NodePlan, Plan
from ...runs import RunDir, write_json_atomic
from ...spec import ClusterSpec
from .api import KubeApi, KubeError
from .channel import PodChannel, follow
from .manifests import JOBSET_API, LABEL_JOB, render
from .pods import PodView, pod_view

SETTLE_S = 5.0  # a failed JobSet/Job: how long its pods that ran may take to report before the others fail
GONE_WAIT_S = 120.0  # an Indexed Job deleted for a restart: how long its pods may take to go


class KubernetesBackend(Backend):
    name = "kubernetes"
    transfers = False  # logs arrive whole through the API; checkpoints live on the volume
    restarts_tasks = True  # a task's Job replaces its failed pod (same index, hostname, TF_CONFIG): restart_task
    replaces_sidecars = True  # the evaluator's Job replaces its failed pod, uncounted (podFailurePolicy Ignore)

    def __init__(
        self,
        spec: ClusterSpec,
        plan: Plan,
        api: KubeApi | None = None,
        *,
        poll_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert spec.kubernetes is not None
        self.spec, self.plan, self.api = spec, plan, api
        self.flavor = spec.kubernetes.flavor
        self.namespace = spec.kubernetes.namespace
        self.selector = f"{LABEL_JOB}={spec.name}"
        self.poll_s, self.sleep, self.clock = poll_s, sleep, clock
        self.channels: dict[str, PodChannel] = {}
        self.applied: list[dict[str, str]] = []
        self.record_path: Path | None = None
        self.pods: dict[str, dict[str, Any]] = {}  # "attempt/task" -> pod summary
        self._lock = threading.RLock()
        self._closed = False
        self._connected = False
        self._generation = 0
        self._followed: set[str] = set()  # every pod ever followed: a restarted task's pod is a new one

    # --- the seam --------------------------------------------------------------------------------

    def bind_run(self, run_dir: Path) -> None:
        self.record_path = RunDir(Path(run_dir)).kubernetes_json
        self._record()

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        if self._connected:
            return []
        try:
            if self.api is None:
                self.api = KubeApi.connect(self.namespace)
            self.api.check(self.flavor)
        except KubeError as exc:
            return [
                Diagnostic(str(exc), _hint(exc), host=f"kubernetes/{self.namespace}", code=exc.reason or "kubernetes")
            ]
        self._connected = True
        return []

    def start(self, node: NodePlan, config: NodeConfig) -> Channel:
        raise OSError("kubernetes: the pods of an attempt are started together by start_all")

    def start_all(self, starts: Sequence[tuple[NodePlan, NodeConfig]], deliver: Deliver) -> threading.Thread:
        attempt = starts[0][1].attempt if starts else 0
        wanted = [str(node.task) for node, _ in starts]
        with self._lock:
            self._generation += 1  # an earlier attempt's watch stops delivering
            generation = self._generation
        thread = threading.Thread(
            target=self._attempt, args=(attempt, generation, wanted, deliver), name="k8s-attempt", daemon=True
        )
        thread.start()
        return thread

    def restart_task(self, node: NodePlan, config: NodeConfig, deliver: Deliver, placement: Placement) -> None:
        """Follow the pod that replaces this task's failed one. The rendering lets its Job create it
        (``backoffLimitPerIndex``: same completion index, so the same hostname and TF_CONFIG entry);
        a pod still running (a task that hung) is deleted first, which its Job counts as a failure too.
        ``config`` is not used: the new pod builds its settings from its template, as the first did."""
        task = str(node.task)
        with self._lock:
            old = self.channels.get(task)
        attempt = old.attempt if old is not None else 0
        if old is not None and not old.closed and old.exit_status() is None:
            self._delete_pod(old.pod, 0)
        threading.Thread(
            target=self._follow_replacement, args=(task, attempt, deliver), name=f"k8s-restart-{task}", daemon=True
        ).start()

    def _follow_replacement(self, task: str, attempt: int, deliver: Deliver) -> None:
        assert self.api is not None
        deadline = self.clock() + max(self.poll_s, self.spec.job.startup_timeout_s)
        problem = ""
        try:
            while not self._closed:
                views = [pod_view(pod, self.flavor) for pod in self.api.list_pods(self.selector)]
                with self._lock:
                    new = [
                        v
                        for v in views
                        if str(v.task) == task and v.attempt == attempt and v.name not in self._followed
                    ]
                for v in new:
                    if v.started:
                        deliver(task, self._channel(task, v, attempt))
                        return
                    if v.fatal:
                        deliver(task, OSError(f"pod {v.name} cannot start: {v.problem}"))
                        return
                    problem = f"pod {v.name} is {v.phase}: {v.problem}" if v.problem else problem
                ended = self._failed_state()
                if ended or self.clock() >= deadline:
                    why = ended or f"no new pod of {task} running within {self.spec.job.startup_timeout_s:g}s"
                    deliver(task, OSError(problem or f"{task} cannot be restarted: {why}"))
                    return
                self.sleep(self.poll_s)
        except KubeError as exc:
            deliver(task, OSError(f"restarting {task}: {exc}"))
            return
        deliver(task, OSError(f"{task} not restarted: the launcher is closing"))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = list(self.channels.values())
        for chan in channels:
            chan.close()
        self._record_ends()
        if self.api is not None:
            for obj in reversed(self.applied):
                with contextlib.suppress(KubeError):
                    obj["deleted"] = "yes" if self.api.delete(obj["kind"], obj["name"]) else "already gone"
        self._record()

    # --- an attempt ------------------------------------------------------------------------------

    def _attempt(self, attempt: int, generation: int, wanted: list[str], deliver: Deliver) -> None:
        try:
            self._apply(attempt)
        except KubeError as exc:
            for task in wanted:
                deliver(task, OSError(str(exc)))
            return
        delivered: set[str] = set()
        try:
            self._watch(attempt, generation, wanted, deliver, delivered)
        except Exception as exc:  # never a crash of the launcher: the tasks not up yet fail to start
            for task in wanted:
                if task not in delivered:
                    deliver(task, OSError(f"watching the pods failed: {exc}"))

    def _apply(self, attempt: int) -> None:
        assert self.api is not None
        docs = render(self.spec, self.plan, attempt)
        once = [d for d in docs if d["kind"] in ("Secret", "Service", "JobSet")]  # the credentials first
        jobs = [d for d in docs if d["kind"] == "Job"]
        if attempt == 0:
            for doc in once:
                self._create(doc)
        if self.flavor == "jobset":
            if attempt > 0 and self.api.get("JobSet", self.spec.name) is None:
                raise KubeError(f"JobSet {self.namespace}/{self.spec.name} is gone: it cannot restart")
            return  # a restart is the JobSet controller's (failurePolicy.maxRestarts)
        for job in jobs:
            name = job["metadata"]["name"]
            if attempt > 0:
                self.api.delete("Job", name, foreground=True)
                self._wait_gone("Job", name)
            self._create(job)

    def _create(self, doc: dict[str, Any]) -> None:
        assert self.api is not None
        kind, name = doc["kind"], doc["metadata"]["name"]
        try:
            self.api.create(doc)
        except KubeError as exc:
            if exc.status == 409:
                raise KubeError(
                    f"{kind} {self.namespace}/{name} already exists (an earlier run?): delete it first "
                    f"(kubectl delete {kind.lower()} {name} -n {self.namespace}) or rename the job",
                    409,
                    "exists",
                ) from None
            raise
        with self._lock:
            if not any(o["kind"] == kind and o["name"] == name for o in self.applied):
                self.applied.append({"kind": kind, "name": name, "apiVersion": doc["apiVersion"]})
        self._record()

    def _wait_gone(self, kind: str, name: str) -> None:
        assert self.api is not None
        deadline = self.clock() + GONE_WAIT_S + self.spec.job.stop_grace_s
        while self.api.get(kind, name) is not None:
            if self.clock() > deadline:
                raise KubeError(f"{kind} {self.namespace}/{name} was not deleted within {GONE_WAIT_S:g}s")
            self.sleep(self.poll_s)

    def _watch(self, attempt: int, generation: int, wanted: list[str], deliver: Deliver, mine: set[str]) -> None:
        """Deliver each task's channel as its container runs (``mine``: those delivered); then keep
        the record current until they end, the backend closes, or a later attempt starts."""
        assert self.api is not None
        pending = set(wanted)
        current = attempt
        problems: dict[str, str] = {}
        failed_since: float | None = None
        deadline = self.clock() + max(self.poll_s, self.spec.job.startup_timeout_s - 2.0)
        while not self._closed and generation == self._generation:
            try:
                views = [pod_view(pod, self.flavor) for pod in self.api.list_pods(self.selector)]
            except KubeError as exc:
                views = []
                problems = {t: str(exc) for t in pending}
            if not mine and not any(v.attempt == attempt for v in views):
                # a JobSet that restarted more often than this launcher saw: follow its newest pods
                current = max(
                    (v.attempt for v in views if v.attempt is not None and v.attempt >= attempt), default=attempt
                )
            ours = self._by_task(views, current)
            self._remember(current, ours)
            for task in sorted(pending):
                v = ours.get(task)
                if v is None:
                    continue
                if v.started:
                    pending.discard(task)
                    mine.add(task)
                    deliver(
                        task, self._channel(task, v, current)
                    )  # a late one is closed (its pod deleted) by the supervisor
                elif v.fatal or (v.deleting and v.problem):
                    pending.discard(task)
                    deliver(task, OSError(f"pod {v.name} cannot start: {v.problem}"))
                elif v.problem:
                    problems[task] = f"pod {v.name} is {v.phase}: {v.problem}"
            late = self.clock() >= deadline
            failed = self._failed_state() if pending and not late else None
            if failed and not self._settled(mine, failed_since := failed_since or self.clock()):
                failed = None  # first let the pods that ran report why: that is the root cause, not this
            if pending and (late or failed):
                why = failed or f"not running within {self.spec.job.startup_timeout_s:g}s"
                for task in sorted(pending):
                    deliver(task, OSError(problems.get(task) or f"no pod of {task} ({why})"))
                pending.clear()
            if not pending and all(self.channels[t].exit_status() is not None for t in mine if t in self.channels):
                self._record_ends()
                return
            self.sleep(self.poll_s if pending else 5 * self.poll_s)  # then only the record needs it

    def _by_task(self, views: list[PodView], attempt: int) -> dict[str, PodView]:
        """Each task's pod of the attempt; of a task restarted in place, the one followed now."""
        out: dict[str, PodView] = {}
        with self._lock:
            followed = {t: c.pod for t, c in self.channels.items()}
        for v in views:
            if v.attempt == attempt and v.task is not None:
                task = str(v.task)
                if task not in out or followed.get(task) == v.name:
                    out[task] = v
        return out

    def _settled(self, tasks: set[str], since: float) -> bool:
        """Has the supervisor read these tasks' ends (a moment ago), or have they had ``SETTLE_S``?"""
        waited = self.clock() - since
        if waited >= SETTLE_S:
            return True
        return waited >= 0.5 and all(self.channels[t].eof_read for t in tasks if t in self.channels)

    def _channel(self, task: str, v: PodView, attempt: int) -> PodChannel:
        assert self.api is not None
        chan = PodChannel(task, v.name, self._delete_pod, self.spec.job.stop_grace_s)
        chan.attempt = attempt
        with self._lock:
            old = self.channels.get(task)
            self.channels[task] = chan
            self._followed.add(v.name)
        if old is not None and not old.closed:
            old.close()
        hb = self.spec.heartbeat
        read_timeout = max(30.0, 3 * hb.timeout_s)  # heartbeats keep a live stream busy
        threading.Thread(
            target=follow,
            args=(self.api, chan),
            kwargs={"read_timeout_s": read_timeout},
            name=f"k8s-log-{task}",
            daemon=True,
        ).start()
        return chan

    def _failed_state(self) -> str | None:
        """Why no more pods will come: the JobSet or a Job ended (Failed or Complete)."""
        assert self.api is not None
        kinds = ["JobSet"] if self.flavor == "jobset" else ["Job"]
        for obj in self.applied:
            if obj["kind"] not in kinds:
                continue
            try:
                current = self.api.get(obj["kind"], obj["name"])
            except KubeError:
                continue
            if current is None:
                return f"{obj['kind']} {obj['name']} was deleted"
            for cond in (current.get("status") or {}).get("conditions") or []:
                if cond.get("type") in ("Failed", "Complete", "Completed") and cond.get("status") == "True":
                    return f"{obj['kind']} {obj['name']} is {cond['type']}: {cond.get('message') or cond.get('reason') or ''}".rstrip(
                        ": "
                    )
        return None

    def _delete_pod(self, pod: str, grace_s: int) -> None:
        if self.api is not None:
            with contextlib.suppress(KubeError):
                self.api.delete_pod(pod, grace_s)

    # --- the record ------------------------------------------------------------------------------

    def _remember(self, attempt: int, views: dict[str, PodView]) -> None:
        changed = False
        with self._lock:
            for task, v in views.items():
                summary = v.summary()
                key = f"{attempt}/{task}"
                if self.pods.get(key) != summary:
                    self.pods[key] = summary
                    changed = True
        if changed:
            self._record()

    def _record_ends(self) -> None:
        """How each followed container ended, as its follower read it (the pod may be gone by now)."""
        with self._lock:
            for task, chan in self.channels.items():
                summary = self.pods.get(f"{chan.attempt}/{task}")
                if chan.end is None or summary is None:
                    continue
                end = chan.end
                summary.update({"exit_code": end.exit_code, "reason": end.reason, "message": end.message})
                summary["phase"] = "Succeeded" if end.exit_code == 0 else "Failed"
        self._record()

    def record(self) -> dict[str, Any]:
        with self._lock:
            return {
                "namespace": self.namespace,
                "flavor": self.flavor,
                "api_version": JOBSET_API if self.flavor == "jobset" else "batch/v1",
                "objects": [dict(o) for o in self.applied],
                "pods": dict(self.pods),
                "closed": self._closed,
                "updated": time.time(),
            }

    def _record(self) -> None:
        if self.record_path is None:
            return
        with contextlib.suppress(OSError):
            write_json_atomic(self.record_path, self.record(), durable=False)


def _hint(exc: KubeError) -> str:
    if exc.reason == "not_installed":
        return "pip install 'tfcluster[kubernetes]' on the launcher"
    if exc.reason == "no_jobset":
        return (
            "install the JobSet controller (kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
            "releases/download/v0.12.0/manifests.yaml) or set kubernetes.flavor: indexed-job"
        )
    if exc.reason == "config":
        return "set KUBECONFIG or the current context (kubectl config use-context), or run inside the cluster"
    if exc.status in (401, 403):
        return "your credentials may not list pods or create Jobs in this namespace (kubectl auth can-i)"
    return "check kubectl get pods -n NAMESPACE works from this machine"
