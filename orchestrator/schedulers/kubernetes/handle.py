"""A Kubernetes run seen from outside: RUN/kubernetes.json (the objects applied, every pod's phase, node
and exit) in ``status``, and — when the launcher is gone and its objects are not — ``stop`` deletes
them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from ...core.text import table
from ...runs import plan_or_none, write_json_atomic
from ...views.handle import RunHandle

if TYPE_CHECKING:
    from .ownership import RunOwner


class KubernetesHandle(RunHandle):
    def record(self) -> dict[str, Any] | None:
        data = self.run.read_json(self.run.kubernetes_json)
        return data if isinstance(data, dict) else None

    def scheduler_status(self) -> dict[str, Any]:
        kube = self.record()
        return {"kubernetes": kube} if kube is not None else {}

    def detail_lines(self, status: dict[str, Any]) -> list[str]:
        return pods_text(status.get("kubernetes"))

    def gone_message(self, status: dict[str, Any]) -> str:
        kube = self.record()
        if kube is not None and not kube.get("closed"):
            return (
                "the launcher is not running and wrote no result.json; the pods it applied keep running without it "
                f"(`tfcluster stop {self.run.path}` deletes them); last known state: {status.get('state', 'unknown')}"
            )
        return super().gone_message(status)

    def stop_without_launcher(self) -> str:
        kube = self.record()
        if kube is None or not kube.get("objects") or kube.get("closed"):
            return super().stop_without_launcher()
        from .ownership import delete_recorded

        owner = self.owner()
        done = (
            delete_recorded(kube, owner)
            if owner is not None
            else [
                "refusing: the run directory's plan.json or spec.yaml does not say which job, run and namespace it is"
            ]
        )
        write_json_atomic(self.run.kubernetes_json, {**kube, "closed": True, "stopped": done}, durable=False)
        return "the launcher is not running; deleted what it applied: " + "; ".join(done)

    def owner(self) -> RunOwner | None:
        """The run's job, run id (plan.json) and namespace (its spec copy): what its objects must carry."""
        from .ownership import RunOwner

        plan = plan_or_none(self.run)
        try:
            data = yaml.safe_load(self.run.spec_yaml.read_text()) if self.run.spec_yaml.is_file() else None
        except (OSError, yaml.YAMLError):
            data = None
        kube = data.get("kubernetes") if isinstance(data, dict) else None
        if plan is None or not isinstance(kube, dict):
            return None
        job, run_id, namespace = plan.job, plan.run_id, kube.get("namespace", "default")
        if not all(isinstance(v, str) and v for v in (job, run_id, namespace)):
            return None
        return RunOwner(namespace=namespace, job=job, run_id=run_id)


def pods_text(kube: Any) -> list[str]:
    """The pods of a Kubernetes run, newest attempt last: phase, node, how each container ended."""
    if not isinstance(kube, dict) or not isinstance(kube.get("pods"), dict):
        return []
    objects = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in kube.get("objects") or [] if isinstance(o, dict))
    head = f"kubernetes: namespace {kube.get('namespace')}   {objects or 'nothing applied'}"
    if not kube["pods"]:
        return ["", head]
    rows = [("ATTEMPT/TASK", "POD", "PHASE", "NODE", "EXIT", "REASON")]
    for key, pod in sorted(kube["pods"].items(), key=_attempt_order):
        if not isinstance(pod, dict):
            continue
        rows.append(
            (
                key,
                str(pod.get("pod", "")),
                str(pod.get("phase", "")),
                str(pod.get("node") or ""),
                "" if pod.get("exit_code") is None else str(pod.get("exit_code")),
                str(pod.get("reason") or pod.get("problem") or "")[:80],
            )
        )
    return ["", head, *table(rows)]


def _attempt_order(kv: tuple[str, Any]) -> tuple[int, str]:
    attempt = kv[0].split("/")[0]
    return (int(attempt) if attempt.isdigit() else 0, kv[0])
