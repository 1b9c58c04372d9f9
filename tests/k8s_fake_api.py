"""FAKE TIER — the Kubernetes client's faces over ``k8s_fake.FakeCluster``: ``CoreV1Api``, ``BatchV1Api``,
``CustomObjectsApi`` and a followed pod log, with the recorded API bodies and errors they return.

Split from ``k8s_fake`` (which re-exports every name here): the cluster's state and its controllers
there, the method-by-method client surface here. ``ACCEPTED`` lists the keyword arguments the backend
may pass per method; ``test_k8s_launch.py`` checks it against the real client when it is installed.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker_entry import protocol as p
from worker_entry.protocol.podlog import encode_message, encode_output

if TYPE_CHECKING:
    from k8s_fake import FakeCluster

RECORDED = Path(__file__).resolve().parent / "k8s_recorded"
#: Keyword arguments the backend may pass per method (checked against the real client's signatures).
ACCEPTED = {
    "create_namespaced_secret": {"_preload_content"},
    "read_namespaced_secret": {"_preload_content"},
    "delete_namespaced_secret": {"body", "_preload_content"},
    "create_namespaced_service": {"_preload_content"},
    "read_namespaced_service": {"_preload_content"},
    "delete_namespaced_service": {"body", "_preload_content"},
    "list_namespaced_pod": {"label_selector", "_preload_content"},
    "read_namespaced_pod": {"_preload_content"},
    "delete_namespaced_pod": {"grace_period_seconds", "_preload_content"},
    "read_namespaced_pod_log": {
        "container",
        "follow",
        "timestamps",
        "since_seconds",
        "_request_timeout",
        "_preload_content",
    },
    "create_namespaced_job": {"_preload_content"},
    "read_namespaced_job": {"_preload_content"},
    "delete_namespaced_job": {"propagation_policy", "body", "_preload_content"},
    "create_namespaced_custom_object": {"_preload_content"},
    "get_namespaced_custom_object": {"_preload_content"},
    "delete_namespaced_custom_object": {"propagation_policy", "body", "_preload_content"},
    "list_namespaced_custom_object": {"limit", "_preload_content"},
}


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text())


class FakeApiException(Exception):
    """Carries what ``kubernetes.client.ApiException`` carries: status, reason, body (JSON text)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"({status}) Reason: {body.get('reason')}")
        self.status = status
        self.reason = body.get("reason")
        self.body = json.dumps(body)


class FakeResponse:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()
        self.status = 200

    def release_conn(self) -> None:
        pass


# --- what worker_entry prints in a pod ----------------------------------------------------------


def msg_line(msg: p.Message) -> bytes:
    return encode_message(json.dumps(msg.to_dict(), separators=(",", ":")).encode())


def hello(task: str) -> bytes:
    kind, index = task.split(":")
    facts = p.NodeFacts(
        hostname=f"pod-{kind}-{index}",
        python="3.11.7",
        packages={"tensorflow": "2.21.0", "tf_keras": "2.21.0", "tfcluster": "0.1.0"},
        time=time.time(),
    )
    return msg_line(
        p.Hello(pid=1, remote_dir=f"/tfcluster/{kind}-{index}", facts=facts, task=p.TaskRef(kind, int(index)))
    )


def started_lines(task: str, text: str = "") -> list[bytes]:
    lines = [hello(task), msg_line(p.Spawned(pid=7)), msg_line(p.Heartbeat(seq=1, ts=time.time(), state="running"))]
    lines.append(msg_line(p.Started(how="strategy")))
    if text:
        lines.append(encode_output(text.encode()))
    return lines


def exited_line(
    code: int | None = 0, signal: int | None = None, stopped: bool = False, reason: str | None = None
) -> bytes:
    name = "SIGTERM" if signal == 15 else None
    return msg_line(
        p.Exited(code=code, signal=signal, signal_name=name, stopped=stopped, reason=reason, ended=time.time())
    )


class FakeLog:
    """A followed log as urllib3 gives it with ``_preload_content=False``: ``stream()`` blocks for more."""

    def __init__(self, cluster: FakeCluster, pod: str, since_seconds: int | None) -> None:
        self.cluster, self.pod = cluster, pod
        self.pos = 0
        self.closed = False
        if since_seconds is not None:
            cutoff = time.time() - since_seconds
            self.pos = sum(1 for ts, _ in cluster.logs.get(pod, []) if ts < cutoff)
        self.cut_after = None
        for prefix, n in list(cluster.drop_log_after.items()):
            if pod.startswith(prefix):
                self.cut_after = n
                del cluster.drop_log_after[prefix]

    def stream(self, amt: int):
        c = self.cluster
        sent = 0
        while True:
            with c.cond:
                while not self.closed and self.pos >= len(c.logs.get(self.pod, [])) and self.pod not in c.ended:
                    c.cond.wait(0.2)
                if self.closed:
                    return
                lines = c.logs.get(self.pod, [])[self.pos :]
                self.pos += len(lines)
                done = self.pod in c.ended and self.pos >= len(c.logs.get(self.pod, []))
            for ts, line in lines:
                if self.cut_after is not None and sent >= self.cut_after:
                    raise ConnectionResetError("the API server closed the stream")
                sent += 1
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z "
                yield stamp.encode() + line
            if done:
                return

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        with self.cluster.cond:
            self.closed = True
            self.cluster.cond.notify_all()


class _Core:
    def __init__(self, c: FakeCluster) -> None:
        self.c = c

    def create_namespaced_secret(self, namespace, body, **kw):
        self.c.call("create_namespaced_secret", (namespace,), kw)
        if ("Secret", body["metadata"]["name"]) in self.c.objects:
            raise FakeApiException(409, recorded("status-409.json"))
        self.c.created.append(copy.deepcopy(body))
        return FakeResponse(self.c.store("Secret", body))

    def read_namespaced_secret(self, name, namespace, **kw):
        self.c.call("read_namespaced_secret", (name, namespace), kw)
        if ("Secret", name) not in self.c.objects:
            raise self.c.not_found(name)
        return FakeResponse(self.c.objects[("Secret", name)])

    def delete_namespaced_secret(self, name, namespace, **kw):
        self.c.call("delete_namespaced_secret", (name, namespace), kw)
        self.c.precondition("Secret", name, kw)
        if self.c.objects.pop(("Secret", name), None) is None:
            raise self.c.not_found(name)
        return FakeResponse({})

    def create_namespaced_service(self, namespace, body, **kw):
        self.c.call("create_namespaced_service", (namespace,), kw)
        self.c.created.append(copy.deepcopy(body))
        return FakeResponse(self.c.store("Service", body))

    def read_namespaced_service(self, name, namespace, **kw):
        self.c.call("read_namespaced_service", (name, namespace), kw)
        if ("Service", name) not in self.c.objects:
            raise self.c.not_found(name)
        return FakeResponse(self.c.objects[("Service", name)])

    def delete_namespaced_service(self, name, namespace, **kw):
        self.c.call("delete_namespaced_service", (name, namespace), kw)
        self.c.precondition("Service", name, kw)
        if self.c.objects.pop(("Service", name), None) is None:
            raise self.c.not_found(name)
        return FakeResponse(recorded("status-404.json") | {"status": "Success", "code": 200})

    def list_namespaced_pod(self, namespace, **kw):
        self.c.call("list_namespaced_pod", (namespace,), kw)
        self.c.advance()
        key, _, value = kw.get("label_selector", "").partition("=")
        with self.c.cond:
            pods = sorted(self.c.pods_of(**{key: value}), key=lambda pod: pod["metadata"]["name"])  # as the API server
            items = [{k: v for k, v in pod.items() if k != "_task"} for pod in pods]
            # ended pods disappear a moment later (their Job's finalizer is gone)
            for name in [
                n for n in self.c.ended if n in self.c.pods and self.c.pods[n]["metadata"].get("deletionTimestamp")
            ]:
                self.c.pods.pop(name)
        return FakeResponse(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
        )

    def read_namespaced_pod(self, name, namespace, **kw):
        self.c.call("read_namespaced_pod", (name, namespace), kw)
        with self.c.cond:
            pod = self.c.pods.get(name)
            if pod is None:
                raise self.c.not_found(name)
            return FakeResponse({k: v for k, v in pod.items() if k != "_task"})

    def delete_namespaced_pod(self, name, namespace, **kw):
        self.c.call("delete_namespaced_pod", (name, namespace), kw)
        if name not in self.c.pods:
            raise self.c.not_found(name)
        if kw.get("grace_period_seconds") == 0:
            self.c.force_delete(name)
        else:
            self.c.sigterm(name, kw.get("grace_period_seconds"))
        return FakeResponse({})

    def read_namespaced_pod_log(self, name, namespace, **kw):
        self.c.call("read_namespaced_pod_log", (name, namespace), kw)
        assert kw.get("follow") is True and kw.get("timestamps") is True and kw.get("container") == "tensorflow"
        if name not in self.c.pods:
            raise self.c.not_found(name)
        return FakeLog(self.c, name, kw.get("since_seconds"))


class _Batch:
    def __init__(self, c: FakeCluster) -> None:
        self.c = c

    def create_namespaced_job(self, namespace, body, **kw):
        self.c.call("create_namespaced_job", (namespace,), kw)
        if ("Job", body["metadata"]["name"]) in self.c.objects:
            raise FakeApiException(409, recorded("status-409.json"))
        self.c.created.append(copy.deepcopy(body))
        self.c.create_job(body)
        return FakeResponse(self.c.objects[("Job", body["metadata"]["name"])])

    def read_namespaced_job(self, name, namespace, **kw):
        self.c.call("read_namespaced_job", (name, namespace), kw)
        if ("Job", name) not in self.c.objects:
            raise self.c.not_found(name)
        return FakeResponse(self.c.objects[("Job", name)])

    def delete_namespaced_job(self, name, namespace, **kw):
        self.c.call("delete_namespaced_job", (name, namespace), kw)
        if ("Job", name) not in self.c.objects:
            raise self.c.not_found(name)
        self.c.precondition("Job", name, kw)
        self.c.delete_owned("Job", name)
        return FakeResponse({})


class _Custom:
    """CustomObjectsApi: JobSets, and NetworkPolicies (the launcher reaches them through the same
    generic path: /apis/networking.k8s.io/v1/namespaces/NS/networkpolicies)."""

    KINDS = {
        ("jobset.x-k8s.io", "v1alpha2", "jobsets"): "JobSet",
        ("networking.k8s.io", "v1", "networkpolicies"): "NetworkPolicy",
    }

    def __init__(self, c: FakeCluster) -> None:
        self.c = c

    def _kind(self, group, version, plural) -> str:
        assert (group, version, plural) in self.KINDS, (group, version, plural)
        return self.KINDS[(group, version, plural)]

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kw):
        self.c.call("create_namespaced_custom_object", (group, version, namespace, plural), kw)
        kind = self._kind(group, version, plural)
        if (kind, body["metadata"]["name"]) in self.c.objects:
            raise FakeApiException(409, recorded("status-409.json"))
        self.c.created.append(copy.deepcopy(body))
        if kind == "NetworkPolicy":
            return FakeResponse(self.c.store(kind, body))
        self.c.create_jobset(body)
        return FakeResponse(self.c.objects[("JobSet", body["metadata"]["name"])])

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        self.c.call("get_namespaced_custom_object", (group, version, namespace, plural, name), kw)
        kind = self._kind(group, version, plural)
        if (kind, name) not in self.c.objects:
            raise self.c.not_found(name)
        return FakeResponse(self.c.objects[(kind, name)])

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        self.c.call("delete_namespaced_custom_object", (group, version, namespace, plural, name), kw)
        kind = self._kind(group, version, plural)
        if (kind, name) not in self.c.objects:
            raise self.c.not_found(name)
        self.c.precondition(kind, name, kw)
        if kind == "NetworkPolicy":
            del self.c.objects[(kind, name)]
        else:
            self.c.delete_owned("JobSet", name)
        return FakeResponse({})

    def list_namespaced_custom_object(self, group, version, namespace, plural, **kw):
        self.c.call("list_namespaced_custom_object", (group, version, namespace, plural), kw)
        self._kind(group, version, plural)
        items = [o for (k, _), o in self.c.objects.items() if k == "JobSet"]
        return FakeResponse({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSetList", "items": items})
