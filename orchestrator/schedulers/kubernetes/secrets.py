"""Credentials of a Kubernetes rendering: in a ``Secret``, never in the Jobs' or pods' plain text.

Anyone who may read Jobs or Pods (and etcd's backups) reads their ``env`` values and ``args``. So
what the redaction rules (``core.redact``) call a credential — a ``job.env`` value under a
credential-looking name or holding a token, a command-line word after ``--token`` or holding one —
goes into one Secret rendered alongside (``<name>-credentials``, applied first, deleted with the
rest), and reaches the container through ``secretKeyRef``: an env value by its own name, a command
word as ``$(TFCLUSTER_SECRET_ARG_<i>)``, which the kubelet expands when it starts the container.
Because the kubelet expands ``$(...)`` in every ``value``, ``command`` and ``args``, every other ``$``
is escaped (``$$``) so that the pod runs exactly the plan's words, as over SSH.

``kubernetes.env_secret`` names a Secret the user keeps instead: its keys become environment
variables of every pod (``envFrom``), and the spec need not hold the credentials at all.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from worker_entry.protocol import Env

from ...core.redact import redact_argv, redact_env
from ...spec import ClusterSpec

SECRET_SUFFIX = "-credentials"


@dataclass(frozen=True)
class Credentials:
    """What of a job's environment and command goes into its Secret (key = environment name)."""

    secret: str
    env: dict[str, str] = field(default_factory=dict)
    args: dict[int, str] = field(default_factory=dict)  # index in the command -> the word

    @property
    def data(self) -> dict[str, str]:
        return {**self.env, **{arg_env(i): word for i, word in self.args.items()}}

    def __bool__(self) -> bool:
        return bool(self.env or self.args)


def secret_name(spec: ClusterSpec) -> str:
    return f"{spec.name}{SECRET_SUFFIX}"


def arg_env(index: int) -> str:
    """The environment name a credential command word reaches the container under."""
    return f"{Env.SECRET_ARG}_{index}"


def credentials(spec: ClusterSpec) -> Credentials:
    """The credentials of ``job.env`` and ``job.command``, by the redaction rules."""
    env = spec.job.env
    shown_env = redact_env(env)
    command = list(spec.job.command)
    shown_args = redact_argv(command)
    return Credentials(
        secret=secret_name(spec),
        env={k: v for k, v in env.items() if shown_env[k] != v},
        args={i: word for i, word in enumerate(command) if shown_args[i] != word},
    )


def secret_doc(creds: Credentials, meta: dict[str, Any]) -> dict[str, Any]:
    """The Secret (``meta``: the rendering's name, namespace, labels and run annotation)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode("ascii") for k, v in sorted(creds.data.items())},
    }


def escape(text: str) -> str:
    """A literal for ``value``/``command``/``args``: the kubelet turns ``$$`` into ``$`` and expands ``$(X)``."""
    return text.replace("$", "$$")


def container_env(env: dict[str, str], creds: Credentials) -> list[dict[str, Any]]:
    """The container's ``env``: credentials by reference, everything else escaped."""
    out: list[dict[str, Any]] = []
    for name, value in env.items():
        if name in creds.env:
            out.append(_ref(name, creds))
        else:
            out.append({"name": name, "value": escape(value)})
    out += [_ref(arg_env(i), creds) for i in sorted(creds.args)]
    return out


def container_args(command: list[str], creds: Credentials) -> list[str]:
    return [f"$({arg_env(i)})" if i in creds.args else escape(word) for i, word in enumerate(command)]


def env_from(spec: ClusterSpec) -> list[dict[str, Any]]:
    k8s = spec.kubernetes
    assert k8s is not None
    return [{"secretRef": {"name": k8s.env_secret}}] if k8s.env_secret else []


def _ref(name: str, creds: Credentials) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": creds.secret, "key": name}}}
