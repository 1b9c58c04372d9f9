"""What a pod's status says, in tfcluster's terms: its task, attempt, whether its container has
started, why it cannot start, how it ended. Pure functions over the API's JSON (``kubectl get -o
json`` shapes), so the fake tier's recorded pods and real ones go through the same code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker_entry.protocol.roles import ROLES

from ...plan import TaskId
from .manifests import ANNOTATION_ATTEMPT, COMPLETION_INDEX, CONTAINER, JOBSET_RESTART_ATTEMPT, LABEL_TASK_TYPE
from .stream import ContainerEnd

#: Waiting reasons the kubelet will not get past by itself: the task cannot start.
FATAL_WAITING = frozenset(
    {
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
HINTS = {
    "OOMKilled": "the container exceeded its memory limit: raise kubernetes.limits.memory (or use less memory)",
    "Evicted": "the node ran out of a resource and evicted the pod: set kubernetes.requests to what the task uses",
    "ImagePullBackOff": "check kubernetes.image and kubernetes.image_pull_secrets",
    "InvalidImageName": "check kubernetes.image",
    "CreateContainerConfigError": "a referenced Secret, ConfigMap or volume is missing",
    "DeadlineExceeded": "the pod ran past its active deadline",
}


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str
    task: TaskId | None
    attempt: int | None
    node: str | None
    started: bool  # the container ran (its log can be read)
    deleting: bool
    problem: str | None  # why it is not running yet (or cannot start), for messages
    fatal: bool  # it will never start
    end: ContainerEnd | None  # it ended (terminated state of the container)
    grace_s: float | None = None  # its deletion's grace period (or the pod's), None: not said

    def summary(self) -> dict[str, Any]:
        """The record kept in RUN/kubernetes.json."""
        out: dict[str, Any] = {"pod": self.name, "phase": self.phase, "node": self.node, "attempt": self.attempt}
        if self.problem:
            out["problem"] = self.problem
        if self.end is not None:
            out.update({"exit_code": self.end.exit_code, "reason": self.end.reason, "message": self.end.message})
        return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def task_of(pod: dict[str, Any]) -> TaskId | None:
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    kind = labels.get(LABEL_TASK_TYPE)
    index = _int(annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX)))
    if kind not in ROLES or index is None or index < 0:
        return None
    return TaskId(kind, index)


def attempt_of(pod: dict[str, Any], flavor: str) -> int | None:
    meta = pod.get("metadata") or {}
    if flavor == "jobset":
        return _int(
            (meta.get("labels") or {}).get(
                JOBSET_RESTART_ATTEMPT, (meta.get("annotations") or {}).get(JOBSET_RESTART_ATTEMPT)
            )
        )
    return _int((meta.get("annotations") or {}).get(ANNOTATION_ATTEMPT))


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == CONTAINER:
            return cs
    return {}


def container_end(pod: dict[str, Any] | None) -> ContainerEnd | None:
    if not pod:
        return None
    name = str((pod.get("metadata") or {}).get("name", "?"))
    status = pod.get("status") or {}
    term = ((container_status(pod).get("state") or {}).get("terminated")) or None
    if term is None:
        if status.get("phase") == "Failed" and status.get("reason"):  # evicted before/without a container status
            return ContainerEnd(name, None, str(status["reason"]), _hinted(status.get("reason"), status.get("message")))
        return None
    reason = term.get("reason")
    message = term.get("message") or status.get("message")
    if status.get("reason") == "Evicted":
        reason = "Evicted"
    return ContainerEnd(name, _int(term.get("exitCode")), reason, _hinted(reason, message))


def _hinted(reason: Any, message: Any) -> str | None:
    hint = HINTS.get(str(reason)) if reason else None
    parts = [str(m).strip()[:500] for m in (message, hint) if m]
    return "; ".join(parts) or None


def pod_view(pod: dict[str, Any], flavor: str) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    state = container_status(pod).get("state") or {}
    phase = str(status.get("phase") or "Unknown")
    end = container_end(pod)
    started = bool(state.get("running") or state.get("terminated"))
    problem, fatal = None, False
    waiting = state.get("waiting") or {}
    if waiting.get("reason") and waiting.get("reason") not in ("ContainerCreating", "PodInitializing"):
        problem = f"{waiting['reason']}: {str(waiting.get('message') or '').strip()[:500]}".rstrip(": ")
        fatal = waiting["reason"] in FATAL_WAITING
        hint = HINTS.get(waiting["reason"])
        if hint:
            problem += f" ({hint})"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            problem = f"{cond.get('reason') or 'not scheduled'}: {str(cond.get('message') or '').strip()[:500]}"
    if end is not None and not started:  # evicted or failed before its container ever ran
        problem, fatal = end.describe(), True
    return PodView(
        name=str(meta.get("name", "?")),
        phase=phase,
        task=task_of(pod),
        attempt=attempt_of(pod, flavor),
        node=(pod.get("spec") or {}).get("nodeName"),
        started=started,
        deleting=bool(meta.get("deletionTimestamp")),
        problem=problem,
        fatal=fatal,
        end=end,
        grace_s=_grace(meta, pod.get("spec") or {}),
    )


def _grace(meta: dict[str, Any], spec: dict[str, Any]) -> float | None:
    """The grace the kubelet has to end the pod: the deletion's, else the pod's own."""
    for value in (meta.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")):
        n = _int(value)
        if n is not None and 0 <= n <= 86400:
            return float(n)
    return None
