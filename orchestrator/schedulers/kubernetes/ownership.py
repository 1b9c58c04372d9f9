"""Which Kubernetes objects are a run's, on proof the run directory cannot forge.

RUN/kubernetes.json, plan.json and spec.yaml are files a user controls: whoever crafts a run directory
could name any job, run id, namespace and object there, and ``stop`` may run as an admin whose
kubeconfig may delete anything. So the launcher keeps the proof in its *private state*, outside every
run directory: ``$XDG_STATE_HOME/tfcluster/kubernetes/<run id>.json`` (default ~/.local/state; the
directory 0700, the file 0600, never through a link), written as the objects are created: the run
directory it belongs to, the namespace, each object's kind, name and ``metadata.uid`` (which the API
server assigns and nobody can choose), and a random per-run nonce. Every object carries the nonce's
SHA-256 in its ``tfcluster/owner`` annotation.

``stop`` of a run whose launcher is gone reads the *caller's* private state for the run id: no record
(another user's run, a crafted directory, a run of another machine) is a refusal that deletes nothing.
It deletes only what the record lists, each object only if the live one has the recorded uid and the
nonce's hash, with the uid as the delete's precondition (an object deleted and made again by someone
else in between is not touched). The labels and annotations are checked too (a readable message).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .api import KubeApi, KubeError
from .manifests import ANNOTATION_RUN_ID, LABEL_JOB, MANAGED_BY

ANNOTATION_OWNER = "tfcluster/owner"


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "tfcluster" / "kubernetes"


@dataclass
class PrivateState:
    """The launcher's proof of what a run created (see the module)."""

    run_id: str
    run_dir: str
    namespace: str
    job: str
    nonce: str = field(default_factory=lambda: secrets.token_hex(32))
    objects: list[dict[str, str]] = field(default_factory=list)

    @property
    def owner_hash(self) -> str:
        return hashlib.sha256(self.nonce.encode()).hexdigest()

    @staticmethod
    def path_of(run_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:200]
        return state_dir() / f"{safe}.json"

    def created(self, kind: str, name: str, uid: str) -> None:
        """Record an object the API server created (before anything else may delete it)."""
        self.objects = [o for o in self.objects if (o["kind"], o["name"]) != (kind, name)]
        self.objects.append({"kind": kind, "name": name, "uid": uid})
        self.save()

    def save(self) -> None:
        d = state_dir()
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
        path = self.path_of(self.run_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.__dict__, f)
        os.replace(tmp, path)

    def forget(self) -> None:
        """Nothing of the run is left to stop."""
        with contextlib.suppress(OSError):
            self.path_of(self.run_id).unlink()

    @classmethod
    def load(cls, run_id: str) -> PrivateState | None:
        path = cls.path_of(run_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                if os.fstat(f.fileno()).st_uid != os.geteuid():
                    return None
                data = json.load(f)
            state = cls(**{k: data[k] for k in ("run_id", "run_dir", "namespace", "job", "nonce", "objects")})
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all(isinstance(o, dict) and {"kind", "name", "uid"} <= set(o) for o in state.objects):
            return None
        return state

    def not_ours(self, obj: dict[str, Any], uid: str) -> str | None:
        """Why the live ``obj`` is not the one this run created (None: it is)."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        notes = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if meta.get("namespace") not in (None, self.namespace):
            return f"it is in namespace {meta.get('namespace')!r}, not {self.namespace!r}"
        if meta.get("uid") != uid:
            return f"its uid is {meta.get('uid')!r}, not the {uid!r} this run created (it was made again since)"
        if notes.get(ANNOTATION_OWNER) != self.owner_hash:
            return f"its {ANNOTATION_OWNER} annotation is not this run's proof"
        if any(labels.get(k) != v for k, v in MANAGED_BY.items()):
            return "it is not managed by tfcluster (label app.kubernetes.io/managed-by)"
        if labels.get(LABEL_JOB) != self.job or notes.get(ANNOTATION_RUN_ID) != self.run_id:
            return f"its {LABEL_JOB} label or {ANNOTATION_RUN_ID} annotation is not this run's"
        return None


def stop_recorded(run_id: str | None, run_dir: Path, api: KubeApi | None = None) -> list[str]:
    """``tfcluster stop`` of a run whose launcher is gone: delete what the caller's private state
    records for it, only what is provably this run's (see the module). What happened to each."""
    state = PrivateState.load(run_id) if isinstance(run_id, str) and run_id else None
    if state is None:
        return [
            f"refusing: this user has no private record of run {run_id!r} ({state_dir()}): only the user who "
            "launched it, on the machine it was launched from, can have tfcluster delete its objects; nothing deleted"
        ]
    if os.path.realpath(state.run_dir) != os.path.realpath(run_dir):
        return [f"refusing: run {run_id!r} was launched with the run directory {state.run_dir}, not {run_dir}"]
    if api is None:
        try:
            api = KubeApi.connect(state.namespace)
        except KubeError as exc:
            return [f"cannot reach the cluster: {exc}"]
    out = []
    for obj in reversed(state.objects):
        kind, name, uid = obj["kind"], obj["name"], obj["uid"]
        try:
            live = api.get(kind, name)
            if live is None:
                out.append(f"{kind} {name}: already gone")
                continue
            why = state.not_ours(live, uid)
            if why:
                out.append(f"{kind} {name}: not deleted: {why}")
                continue
            out.append(f"{kind} {name}: {'deleted' if api.delete(kind, name, uid=uid) else 'already gone'}")
        except KubeError as exc:
            out.append(f"{kind} {name}: {exc}")
    if not any(": not deleted" in x or "HTTP" in x for x in out):
        state.forget()
    return out
