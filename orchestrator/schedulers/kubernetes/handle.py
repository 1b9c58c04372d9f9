"""A Kubernetes run seen from outside: RUN/kubernetes.json (the objects applied, every pod's phase, node
and exit) in ``status``, and — when the launcher is gone and its objects are not — ``stop`` deletes
them."""

from __future__ import annotations

from typing import Any

from ...core.text import table
from ...runs import plan_or_none, write_json_atomic
from ...views.handle import RunHandle


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
        from .ownership import stop_recorded

        plan = plan_or_none(self.run)
        run_id = plan.run_id if plan is not None else None
        # what to delete comes from this user's private record of the run, never from the run directory
        done = stop_recorded(run_id, self.run.path)
        write_json_atomic(self.run.kubernetes_json, {**kube, "closed": True, "stopped": done}, durable=False)
        return "the launcher is not running; deleted what it applied: " + "; ".join(done)


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
