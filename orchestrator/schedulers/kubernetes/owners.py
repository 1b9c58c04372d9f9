"""Which pods the launcher follows: those the objects it created made — not whatever carries the labels.

Labels and annotations are set by whoever creates a pod, and anyone who may create pods in the
namespace may copy the job's. A pod followed becomes a task's channel (its log: the task's lines, its
exit, its evaluations), so a forged one could fake a success, feed TensorBoard and the metrics, or pass
for a sidecar's replacement. A pod is followed only when its controller (``ownerReferences`` with
``controller: true``) leads, by ``metadata.uid``, to an object this launcher created (the uids the API
server returned on create): for Indexed Jobs the pod's controller is one of the created Jobs; for a
JobSet it is a Job whose own controller is the created JobSet (read once per Job: its uid must be the
one the pod names). Anything else is ignored, and reported once per pod.
"""

from __future__ import annotations

import threading
from typing import Any

from .api import KubeApi, KubeError


def controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The ownerReference with ``controller: true`` (None: it has none)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    refs = meta.get("ownerReferences") if isinstance(meta.get("ownerReferences"), list) else []
    return next((r for r in refs if isinstance(r, dict) and r.get("controller") is True), None)


def describe(ref: dict[str, Any] | None) -> str | None:
    return None if ref is None else f"{ref.get('kind')}/{ref.get('name')} uid {ref.get('uid')}"


class OwnerChain:
    """The uids of what this launcher created, and the Jobs verified to be theirs."""

    def __init__(self, flavor: str) -> None:
        self.flavor = flavor
        self.created: dict[str, set[str]] = {"JobSet": set(), "Job": set()}
        self.jobs: dict[str, bool] = {}  # a Job's uid -> its controller is a created JobSet
        self._lock = threading.Lock()

    def add(self, kind: str, uid: str | None) -> None:
        if uid and kind in self.created:
            with self._lock:
                self.created[kind].add(uid)

    def why_not(self, pod: dict[str, Any], api: KubeApi) -> str | None:
        """Why the launcher must not follow ``pod`` (None: its controller chain leads to us)."""
        ref = controller(pod)
        if ref is None or ref.get("kind") != "Job" or not isinstance(ref.get("uid"), str):
            return "it has no Job as its controller"
        uid = ref["uid"]
        with self._lock:
            if uid in self.created["Job"] or self.jobs.get(uid):
                return None
            known = uid in self.jobs
        if self.flavor != "jobset" or known:
            return f"its controller {describe(ref)} is not a Job this launcher created"
        try:
            job = api.get("Job", str(ref.get("name")))
        except KubeError as exc:
            return f"its controller {describe(ref)} cannot be read: {exc}"
        meta = (job or {}).get("metadata") or {}
        top = controller(job or {})
        ours = (
            job is not None
            and meta.get("uid") == uid
            and top is not None
            and top.get("kind") == "JobSet"
            and top.get("uid") in self.created["JobSet"]
        )
        with self._lock:
            self.jobs[uid] = ours
        return None if ours else f"its controller {describe(ref)} is not a Job of the JobSet this launcher created"
