"""``tfcluster launch`` with ``scheduler: kubernetes``: apply the rendering, follow every pod, stop.

- attempt 0 creates the rendering (a JobSet, or the Service and the Indexed Jobs); a later attempt
  of a JobSet is the controller's own restart (``failurePolicy.maxRestarts``: all pods together),
  of Indexed Jobs the launcher's (the Jobs deleted, pods gone, created again with the attempt);
  a pod of an earlier attempt that its node never finishes deleting (the node is dead) is
  force-deleted after its grace period (``stuck``): the restart never waits for that node;
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
from ...events.kinds import JobWarning, PodIgnored
from ...plan import NodePlan, Plan
from ...runs import RunDir, write_json_atomic
from ...spec import ClusterSpec
from .api import KubeApi, KubeError, hint
from .applied import Applied
from .channel import PodChannel, follow
from .manifests import JOBSET_API, LABEL_JOB
from .owners import OwnerChain, controller, describe
from .pods import PodView, pod_view
from .stuck import StuckPods, forced_message

SETTLE_S = 5.0  # a failed JobSet/Job: how long its pods that ran may take to report before the others fail


class KubernetesBackend(Backend):
    name = "kubernetes"
    transfers = False  # logs arrive whole through the API; checkpoints live on the volume
    restarts_tasks = True  # a task's Job replaces its failed pod (same index, hostname, TF_CONFIG): restart_task
    replaces_sidecars = True  # the evaluator's Job replaces its failed pod, uncounted (podFailurePolicy Ignore)
    fds_per_task = 1  # its pod's log stream

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
        self.record_path: Path | None = None
        self.pods: dict[str, dict[str, Any]] = {}  # "attempt/task" -> pod summary
        self._lock = threading.RLock()
        self._closed = False
        self._connected = False
        self._generation = 0
        self._followed: set[str] = set()  # every pod ever followed: a restarted task's pod is a new one
        self.chain = OwnerChain(self.flavor)  # only pods of the objects created here are followed
        # what was created, with the proof `stop` needs (ownership: the private state, outside the run dir)
        self.objects = Applied(spec, plan, self.chain, self._record, lambda: self.sleep(self.poll_s), clock)
        self.objects.reap = self._reap_earlier
        if spec.kubernetes.avoid_unresponsive_nodes:
            self.objects.avoid = lambda: tuple(self.stuck.nodes())
        self.stuck = StuckPods(clock)
        self.ignored: dict[str, str] = {}  # pod -> why it is not followed
        self.emit: Callable[[Any], None] | None = None

    # --- the seam --------------------------------------------------------------------------------

    def bind_run(self, run_dir: Path) -> None:
        self.record_path = RunDir(Path(run_dir)).kubernetes_json
        self.objects.bind(Path(run_dir))
        self._record()

    def bind_events(self, emit: Callable[[Any], None]) -> None:
        """The run's event bus (a forged pod is reported as it is seen)."""
        self.emit = emit

    def connect(self, nodes: Sequence[NodePlan]) -> list[Diagnostic]:
        if self._connected:
            return []
        try:
            if self.api is None:
                self.api = KubeApi.connect(self.namespace)
            self.api.check(self.flavor)
        except KubeError as exc:
            return [
                Diagnostic(str(exc), hint(exc), host=f"kubernetes/{self.namespace}", code=exc.reason or "kubernetes")
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
                views = self._views()
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
                ended = self.objects.failed_state(self.api)
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
            self.objects.delete_all(self.api)
        self._record()

    # --- an attempt ------------------------------------------------------------------------------

    def _attempt(self, attempt: int, generation: int, wanted: list[str], deliver: Deliver) -> None:
        try:
            assert self.api is not None
            self.objects.apply(self.api, attempt)
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
                views = self._views()
            except KubeError as exc:
                views = []
                problems = {t: str(exc) for t in pending}
            if not mine and not any(v.attempt == attempt for v in views):
                # a JobSet that restarted more often than this launcher saw: follow its newest pods
                current = max(
                    (v.attempt for v in views if v.attempt is not None and v.attempt >= attempt), default=attempt
                )
            self._reap(views, current)
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
            failed = self.objects.failed_state(self.api) if pending and not late else None
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

    def _reap_earlier(self, attempt: int) -> None:
        """While the launcher waits for an earlier attempt's Jobs to go (Indexed Jobs)."""
        with contextlib.suppress(KubeError):
            self._reap(self._views(), attempt)

    def _reap(self, views: list[PodView], attempt: int) -> None:
        """Force-delete the pods of attempts before ``attempt`` stuck terminating on a node that does
        not answer (``stuck``), saying so."""
        earlier = [v for v in views if v.attempt is not None and v.attempt < attempt]
        for v in self.stuck.overdue(earlier):
            self._delete_pod(v.name, 0)
            if self.emit is not None:
                self.emit(JobWarning(message=forced_message(v)))

    def _views(self) -> list[PodView]:
        """The job's pods that the objects created here made; any other with its labels is ignored."""
        assert self.api is not None
        out = []
        for pod in self.api.list_pods(self.selector):
            why = self.chain.why_not(pod, self.api)
            if why is None:
                out.append(pod_view(pod, self.flavor))
            else:
                self._ignore(pod, why)
        return out

    def _ignore(self, pod: dict[str, Any], why: str) -> None:
        name = str((pod.get("metadata") or {}).get("name", "?"))
        with self._lock:
            if name in self.ignored:
                return
            self.ignored[name] = why
        v = pod_view(pod, self.flavor)
        message = f"pod {name} carries the job's labels ({v.task or 'no task'}) but is not followed: {why}"
        if self.emit is not None:
            self.emit(PodIgnored(task=None, message=message, pod=name, owner=describe(controller(pod))))
        self._record()

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
                "objects": [dict(o) for o in self.objects.objects],
                "pods": dict(self.pods),
                "ignored_pods": dict(self.ignored),
                "closed": self._closed,
                "updated": time.time(),
            }

    def _record(self) -> None:
        if self.record_path is None:
            return
        with contextlib.suppress(OSError):
            write_json_atomic(self.record_path, self.record(), durable=False)
