"""What the launcher created in the cluster, and the proof that it did.

Each object is created with the run's owner proof (``ownership``: the nonce's hash in its
``tfcluster/owner`` annotation) and recorded, with the ``metadata.uid`` the API server gave it, in the
launcher's private state before anything else happens — so ``stop`` can delete it later, and only it —
and in the owner chain the pods are followed by (``owners``). Deleting uses the uid as a precondition.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...plan import Plan
from ...spec import ClusterSpec
from .api import KubeApi, KubeError
from .manifests import render
from .owners import OwnerChain
from .ownership import ANNOTATION_OWNER, PrivateState

GONE_WAIT_S = 120.0  # an Indexed Job deleted for a restart: how long its pods may take to go


class Applied:
    def __init__(
        self,
        spec: ClusterSpec,
        plan: Plan,
        chain: OwnerChain,
        changed: Callable[[], None],
        wait: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        assert spec.kubernetes is not None
        self.spec, self.plan, self.chain, self.changed, self.wait, self.clock = spec, plan, chain, changed, wait, clock
        self.flavor, self.namespace = spec.kubernetes.flavor, spec.kubernetes.namespace
        self.objects: list[dict[str, str]] = []  # kind, name, apiVersion (and "deleted" once it is)
        self.uids: dict[tuple[str, str], str] = {}
        self.private: PrivateState | None = None
        # called while an earlier attempt's Jobs go, with the new attempt (the backend force-deletes
        # the old pods stuck on a node that does not answer)
        self.reap: Callable[[int], None] = lambda attempt: None
        # the nodes a restart's Indexed Jobs keep off (kubernetes.avoid_unresponsive_nodes)
        self.avoid: Callable[[], tuple[str, ...]] = tuple
        self._lock = threading.Lock()

    def bind(self, run_dir: Path) -> None:
        self.private = PrivateState(self.plan.run_id, str(Path(run_dir).resolve()), self.namespace, self.spec.name)

    def apply(self, api: KubeApi, attempt: int) -> None:
        """Attempt 0 creates the rendering; a later one of Indexed Jobs deletes and creates the Jobs again
        (a JobSet restarts itself: ``failurePolicy.maxRestarts``)."""
        docs = render(self.spec, self.plan, attempt)
        once = [d for d in docs if d["kind"] != "Job"]  # the credentials and the NetworkPolicy first
        jobs = [d for d in docs if d["kind"] == "Job"]
        if attempt == 0:
            for doc in once:
                self.create(api, doc)
        if self.flavor == "jobset":
            if attempt > 0 and api.get("JobSet", self.spec.name) is None:
                raise KubeError(f"JobSet {self.namespace}/{self.spec.name} is gone: it cannot restart")
            return
        if attempt > 0:  # every old Job gone first: the nodes found dead meanwhile are kept off by all
            for job in jobs:
                name = job["metadata"]["name"]
                api.delete("Job", name, foreground=True, uid=self.uids.get(("Job", name)))
                self._wait_gone(api, "Job", name, attempt)
            if avoid := self.avoid():
                jobs = [d for d in render(self.spec, self.plan, attempt, avoid) if d["kind"] == "Job"]
        for job in jobs:
            self.create(api, job)

    def create(self, api: KubeApi, doc: dict[str, Any]) -> None:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if self.private is not None:  # the proof `stop` checks: the nonce's hash on every object
            doc["metadata"].setdefault("annotations", {})[ANNOTATION_OWNER] = self.private.owner_hash
        try:
            made = api.create(doc)
        except KubeError as exc:
            if exc.status == 409:
                raise KubeError(
                    f"{kind} {self.namespace}/{name} already exists (an earlier run?): delete it first "
                    f"(kubectl delete {kind.lower()} {name} -n {self.namespace}) or rename the job",
                    409,
                    "exists",
                ) from None
            raise
        uid = (made.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            self.uids[(kind, name)] = uid
            self.chain.add(kind, uid)
            if self.private is not None:
                with contextlib.suppress(OSError):
                    self.private.created(kind, name, uid)
        with self._lock:
            if not any(o["kind"] == kind and o["name"] == name for o in self.objects):
                self.objects.append({"kind": kind, "name": name, "apiVersion": doc["apiVersion"]})
        self.changed()

    def _wait_gone(self, api: KubeApi, kind: str, name: str, attempt: int) -> None:
        """Foreground deletion: the Job goes once its pods have (a pod stuck on a dead node is reaped)."""
        deadline = self.clock() + GONE_WAIT_S + self.spec.job.stop_grace_s
        while api.get(kind, name) is not None:
            if self.clock() > deadline:
                raise KubeError(f"{kind} {self.namespace}/{name} was not deleted within {GONE_WAIT_S:g}s")
            self.reap(attempt)
            self.wait()

    def delete_all(self, api: KubeApi) -> None:
        """The launcher's own end: delete what it created (only those objects: their uids)."""
        for obj in reversed(self.objects):
            with contextlib.suppress(KubeError):
                gone = api.delete(obj["kind"], obj["name"], uid=self.uids.get((obj["kind"], obj["name"])))
                obj["deleted"] = "yes" if gone else "already gone"
        if self.private is not None and all("deleted" in o for o in self.objects):
            self.private.forget()  # nothing of the run is left to stop

    def failed_state(self, api: KubeApi) -> str | None:
        """Why no more pods will come: the JobSet or a Job ended (Failed or Complete)."""
        kinds = ["JobSet"] if self.flavor == "jobset" else ["Job"]
        for obj in self.objects:
            if obj["kind"] not in kinds:
                continue
            try:
                current = api.get(obj["kind"], obj["name"])
            except KubeError:
                continue
            if current is None:
                return f"{obj['kind']} {obj['name']} was deleted"
            for cond in (current.get("status") or {}).get("conditions") or []:
                if cond.get("type") in ("Failed", "Complete", "Completed") and cond.get("status") == "True":
                    why = cond.get("message") or cond.get("reason") or ""
                    return f"{obj['kind']} {obj['name']} is {cond['type']}: {why}".rstrip(": ")
        return None
