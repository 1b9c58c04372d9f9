"""The few Kubernetes API calls tfcluster makes, through the official ``kubernetes`` client.

Every call asks for the raw response (``_preload_content=False``) and reads the API's JSON itself:
the rest of the backend works on plain dicts, the shapes ``kubectl get -o json`` prints, and the fake
tier (``tests/k8s_fake.py``) replays recorded JSON through the same code. Errors of any kind
(HTTP status, connection, config) become one ``KubeError``. The client is imported only by
``KubeApi.connect`` — the SSH path and ``render`` never import it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from .manifests import CONTAINER, JOBSET_API

JOBSET_GROUP, JOBSET_VERSION = JOBSET_API.split("/")
JOBSET_PLURAL = "jobsets"
LOG_CHUNK = 64 << 10


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status (None: no answer at all)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _error(what: str, exc: BaseException) -> KubeError:
    status = getattr(exc, "status", None)
    status = status if isinstance(status, int) and status > 0 else None
    detail = ""
    body = getattr(exc, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError):
            detail = str(json.loads(body).get("message") or "")
    if not detail:
        detail = str(getattr(exc, "reason", "") or exc)
    return KubeError(
        f"{what}: {detail[:500]}" + (f" (HTTP {status})" if status else ""), status, str(getattr(exc, "reason", ""))
    )


def _json(resp: Any) -> dict[str, Any]:
    data = resp.data if hasattr(resp, "data") else resp
    if isinstance(data, dict):
        return data
    try:
        obj = json.loads(data)
    except (ValueError, TypeError) as exc:
        raise KubeError(f"the API server answered with something that is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise KubeError("the API server answered with JSON that is not an object")
    return obj


#: The only kinds tfcluster creates, reads or deletes.
MANAGED_KINDS = ("Secret", "Service", "Job", "JobSet", "NetworkPolicy")
#: Kinds reached through the generic objects API: (group, version, plural).
GENERIC = {
    "JobSet": (JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
}


def _managed(kind: str) -> None:
    if kind not in MANAGED_KINDS:
        raise KubeError(f"tfcluster does not manage a {kind!r} (only {', '.join(MANAGED_KINDS)})", reason="kind")


class LogStream:
    """A followed pod log: iterate for chunks; ``close()`` from any thread ends it."""

    def __init__(self, resp: Any) -> None:
        self.resp = resp
        self.closed = False

    def chunks(self) -> Iterator[bytes]:
        try:
            yield from self.resp.stream(LOG_CHUNK)
        except Exception as exc:
            if not self.closed:
                raise _error("reading the pod log", exc) from None
        finally:
            with contextlib.suppress(Exception):
                self.resp.release_conn()

    def close(self) -> None:
        self.closed = True
        for method in ("shutdown", "close"):
            with contextlib.suppress(Exception):
                getattr(self.resp, method)()
                return


class KubeApi:
    """CoreV1Api, BatchV1Api and CustomObjectsApi (real or fake) for one namespace."""

    def __init__(self, core: Any, batch: Any, custom: Any, namespace: str) -> None:
        self.core, self.batch, self.custom, self.ns = core, batch, custom, namespace

    @classmethod
    def connect(cls, namespace: str) -> KubeApi:
        """The current kubeconfig context, or the in-cluster service account when there is none."""
        try:
            from kubernetes import client, config
        except ImportError:
            raise KubeError(
                "the kubernetes client is not installed: pip install 'tfcluster[kubernetes]'", reason="not_installed"
            ) from None
        try:
            config.load_kube_config()
        except Exception as kube_exc:
            try:
                config.load_incluster_config()
            except Exception:
                raise KubeError(f"no Kubernetes configuration: {kube_exc}", reason="config") from None
        return cls(client.CoreV1Api(), client.BatchV1Api(), client.CustomObjectsApi(), namespace)

    # --- objects ---------------------------------------------------------------------------------

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        kind, name = doc["kind"], doc["metadata"]["name"]
        try:
            if kind == "Secret":
                resp = self.core.create_namespaced_secret(self.ns, doc, _preload_content=False)
                return {"kind": kind, "metadata": (_json(resp).get("metadata") or {})}  # not its data
            if kind == "Service":
                resp = self.core.create_namespaced_service(self.ns, doc, _preload_content=False)
            elif kind == "Job":
                resp = self.batch.create_namespaced_job(self.ns, doc, _preload_content=False)
            elif kind in GENERIC:
                resp = self.custom.create_namespaced_custom_object(
                    *GENERIC[kind][:2], self.ns, GENERIC[kind][2], doc, _preload_content=False
                )
            else:
                raise KubeError(f"cannot create a {kind}")
        except KubeError:
            raise
        except Exception as exc:
            raise _error(f"creating {kind} {self.ns}/{name}", exc) from None
        return _json(resp)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        _managed(kind)
        try:
            if kind == "Secret":
                resp = self.core.read_namespaced_secret(name, self.ns, _preload_content=False)
                return {"kind": kind, "metadata": (_json(resp).get("metadata") or {})}  # never its data
            if kind == "Service":
                resp = self.core.read_namespaced_service(name, self.ns, _preload_content=False)
            elif kind == "Job":
                resp = self.batch.read_namespaced_job(name, self.ns, _preload_content=False)
            else:
                group, version, plural = GENERIC[kind]
                resp = self.custom.get_namespaced_custom_object(
                    group, version, self.ns, plural, name, _preload_content=False
                )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise _error(f"reading {kind} {self.ns}/{name}", exc) from None
        return _json(resp)

    def delete(self, kind: str, name: str, *, foreground: bool = False, uid: str | None = None) -> bool:
        """Delete it and what it owns (``foreground``: the object goes only after its pods); False if
        it was already gone. ``uid``: only the object with that uid (the API server checks it: one
        deleted and made again by someone else in between is refused, HTTP 409)."""
        policy = "Foreground" if foreground else "Background"
        _managed(kind)
        kw: dict[str, Any] = {"_preload_content": False}
        if uid is not None:
            kw["body"] = {"preconditions": {"uid": uid}}
        try:
            if kind == "Secret":
                self.core.delete_namespaced_secret(name, self.ns, **kw)
            elif kind == "Service":
                self.core.delete_namespaced_service(name, self.ns, **kw)
            elif kind == "Job":
                self.batch.delete_namespaced_job(name, self.ns, propagation_policy=policy, **kw)
            else:
                group, version, plural = GENERIC[kind]
                self.custom.delete_namespaced_custom_object(
                    group, version, self.ns, plural, name, propagation_policy=policy, **kw
                )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise _error(f"deleting {kind} {self.ns}/{name}", exc) from None
        return True

    # --- pods ------------------------------------------------------------------------------------

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(self.ns, label_selector=selector, _preload_content=False)
        except Exception as exc:
            raise _error(f"listing pods in {self.ns}", exc) from None
        items = _json(resp).get("items") or []
        return [i for i in items if isinstance(i, dict)]

    def read_pod(self, name: str) -> dict[str, Any] | None:
        try:
            resp = self.core.read_namespaced_pod(name, self.ns, _preload_content=False)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise _error(f"reading pod {self.ns}/{name}", exc) from None
        return _json(resp)

    def delete_pod(self, name: str, grace_s: int) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=grace_s, _preload_content=False)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise _error(f"deleting pod {self.ns}/{name}", exc) from None

    def follow_log(self, pod: str, since_seconds: int | None = None, read_timeout_s: float | None = None) -> LogStream:
        """The container's log from its start (or the last ``since_seconds``), followed, with timestamps."""
        kwargs: dict[str, Any] = {"container": CONTAINER, "follow": True, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        if read_timeout_s is not None:
            kwargs["_request_timeout"] = (10, read_timeout_s)
        try:
            resp = self.core.read_namespaced_pod_log(pod, self.ns, _preload_content=False, **kwargs)
        except Exception as exc:
            raise _error(f"following the log of pod {self.ns}/{pod}", exc) from None
        return LogStream(resp)

    # --- access ----------------------------------------------------------------------------------

    def check(self, flavor: str) -> None:
        """Can we list pods here (and is the JobSet API served)? KubeError says what is missing."""
        self.list_pods("tfcluster/probe=none")
        if flavor != "jobset":
            return
        try:
            self.custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.ns, JOBSET_PLURAL, limit=1, _preload_content=False
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                raise KubeError(
                    "the JobSet API (jobset.x-k8s.io/v1alpha2) is not installed in this cluster", 404, "no_jobset"
                ) from None
            raise _error(f"listing JobSets in {self.ns}", exc) from None


def hint(exc: KubeError) -> str:
    """What to do about an API error, for the connect diagnostic."""
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
