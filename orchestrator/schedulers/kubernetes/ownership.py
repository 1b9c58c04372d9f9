"""``tfcluster stop`` of a Kubernetes run whose launcher is gone: delete what it applied, and only that.

RUN/kubernetes.json lists the objects, but it is only a file in a directory its owner controls, and
``stop`` may run as root with a kubeconfig that may delete anything. So an object is deleted only if
it is of a kind tfcluster creates, in the namespace the run's spec names, and its live labels and run
annotation say it belongs to this run (job label, ``app.kubernetes.io/managed-by: tfcluster``,
``tfcluster/run-id``) — checked on the object as the API server has it, just before the delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import KubeApi, KubeError
from .manifests import ANNOTATION_RUN_ID, LABEL_JOB, MANAGED_BY


def delete_recorded(record: dict[str, Any], owner: RunOwner, api: KubeApi | None = None) -> list[str]:
    """``tfcluster stop`` of a run whose launcher is gone: delete what it applied — only objects of the
    kinds tfcluster creates, in the namespace its spec names, whose live labels and run annotation say
    they are this run's (kubernetes.json is only a file: whoever could write it could list anything, and
    ``stop`` may run as root). Returns what happened to each."""
    namespace = str(record.get("namespace") or "default")
    if namespace != owner.namespace:
        return [f"refusing: kubernetes.json names namespace {namespace!r}, the run's spec {owner.namespace!r}"]
    if api is None:
        try:
            api = KubeApi.connect(namespace)
        except KubeError as exc:
            return [f"cannot reach the cluster: {exc}"]
    out = []
    for obj in reversed(record.get("objects") or []):
        if not isinstance(obj, dict):
            continue
        kind, name = str(obj.get("kind")), str(obj.get("name"))
        try:
            live = api.get(kind, name)
            if live is None:
                out.append(f"{kind} {name}: already gone")
                continue
            why = owner.not_ours(live)
            if why:
                out.append(f"{kind} {name}: not deleted: {why}")
                continue
            out.append(f"{kind} {name}: {'deleted' if api.delete(kind, name) else 'already gone'}")
        except KubeError as exc:
            out.append(f"{kind} {name}: {exc}")
    return out


@dataclass(frozen=True)
class RunOwner:
    """What every object a run applied carries: its job's label, tfcluster's, the run id annotation."""

    namespace: str
    job: str
    run_id: str

    def not_ours(self, obj: dict[str, Any]) -> str | None:
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        notes = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if meta.get("namespace") not in (None, self.namespace):
            return f"it is in namespace {meta.get('namespace')!r}, not {self.namespace!r}"
        if any(labels.get(k) != v for k, v in MANAGED_BY.items()):
            return "it is not managed by tfcluster (label app.kubernetes.io/managed-by)"
        if labels.get(LABEL_JOB) != self.job:
            return f"its {LABEL_JOB} label is {labels.get(LABEL_JOB)!r}, not this run's job {self.job!r}"
        if notes.get(ANNOTATION_RUN_ID) != self.run_id:
            return f"its {ANNOTATION_RUN_ID} annotation is {notes.get(ANNOTATION_RUN_ID)!r}, not this run's {self.run_id!r}"
        return None
