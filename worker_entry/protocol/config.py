"""The ``NodeConfig``: everything worker_entry needs to run one task, the first line the launcher sends.

Split from ``messages`` (the messages name ``TaskRef`` too) so each stays one screenful of contract."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from .cluster import MAX_TASKS, cluster_endpoint, own_endpoint, tf_config_json
from .env import Env
from .frames import ProtocolError, compact_json
from .schema import Record, spec

#: 3: the cluster travels once per connection (``NodeConfig.cluster``), TF_CONFIG is built by worker_entry
VERSION = 3


@dataclass
class TaskRef(Record):
    type: Literal["chief", "worker", "ps", "evaluator"]  # protocol.roles.ROLES
    index: int = field(metadata=spec(lo=0, hi=1 << 20))

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


@dataclass
class NodeConfig(Record):
    """Everything worker_entry needs to run one task: built by the plan, sent as the first stdin line."""

    argv: list[str] = field(metadata=spec(max_len=4096))
    remote_dir: str
    # a newer launcher's config is refused by name (an older node would run without TF_CONFIG)
    protocol: int = field(default=VERSION, metadata=spec(lo=0, hi=VERSION))
    job: str = "job"
    task: TaskRef = field(default_factory=lambda: TaskRef("worker", 0))
    attempt: int = field(default=0, metadata=spec(lo=0, hi=1000))
    workdir: str | None = None
    # the kernel's limit for one variable, 128 KiB (TF_CONFIG, which names every task, is not here: ``cluster``)
    env: dict[str, str] = field(default_factory=dict, metadata=spec(value_len=128 << 10))
    # every task's endpoint by role, once: worker_entry builds the task's TF_CONFIG from it and ``task``
    # (``protocol.cluster.tf_config``). Empty: the node builds its cluster itself (Slurm), or none (a check)
    cluster: dict[str, list[str]] = field(default_factory=dict, metadata=spec(max_len=4, value_len=MAX_TASKS))
    tf_port: int | None = field(default=None, metadata=spec(lo=1, hi=65535))
    gpus: int = field(default=0, metadata=spec(lo=0, hi=1024))
    heartbeat_interval_s: float = field(default=1.0, metadata=spec(lo=0.01, hi=3600))
    # while it waits for the go (0: heartbeat_interval_s, as from a launcher before it): thousands of
    # waiting nodes spread their heartbeats out, the launcher's start is not spent reading them
    waiting_heartbeat_s: float = field(default=0.0, metadata=spec(lo=0, hi=3600))
    launcher_timeout_s: float = field(default=10.0, metadata=spec(lo=0.1, hi=86400))
    stop_grace_s: float = field(default=10.0, metadata=spec(lo=0, hi=86400))
    failure_grace_s: float = field(default=1.0, metadata=spec(lo=0, hi=86400))
    instrument: bool = True
    wait_for_go: bool = True
    checkpoint_dir: str | None = None  # listed in task_files when set (the chief, with checkpoint.gather)
    clean_dirs: list[str] = field(default_factory=list)  # workertemp_* copies removed at the end (non-chief)
    # the job's tasks by role (chief, worker, ps, evaluator), for nodes that build their own TF_CONFIG
    # (Slurm): ranks follow protocol.roles.role_order. Empty: chief (when TF_CONFIG has one) and workers.
    roles: dict[str, int] = field(default_factory=dict, metadata=spec(lo=0, hi=1 << 20, max_len=4))
    adopt_dirs: list[str] = field(default_factory=list, metadata=spec(max_len=128))  # handover.adopt_earlier

    @classmethod
    def parse_line(cls, line: bytes) -> NodeConfig:
        return cls.from_dict(load_object(line, "config"))

    def to_line(self) -> bytes:
        """The config as the one JSON line the node reads. Every task of a plan refers to one cluster
        object: it is encoded once (``_encoded``), not once per task (4,096 configs: 2 s of CPU less), and
        not converted either: ``to_dict`` of the cluster copied every task's address for every task."""
        data = dataclasses.replace(self, cluster={}).to_dict()
        del data["cluster"]
        head = compact_json(data)[:-1].encode()
        return b"".join((head, b',"cluster":', _encoded(self.cluster) if self.cluster else b"{}", b"}\n"))

    def tf_config_json(self) -> str | None:
        """The task's TF_CONFIG (None without a cluster, or when the plan's env already holds one)."""
        if not self.cluster or Env.TF_CONFIG in self.env:
            return None
        return tf_config_json(self.cluster, self.task.type, self.task.index)

    def own_endpoint(self) -> str | None:
        """Where the task's TF server listens: its entry of the cluster (or of an older launcher's TF_CONFIG)."""
        return cluster_endpoint(self.cluster, self.task) or own_endpoint(self.env.get(Env.TF_CONFIG), self.task)


_ENCODED: list[tuple[object, bytes]] = []  # the last cluster encoded, and its JSON


def _encoded(cluster: dict[str, list[str]]) -> bytes:
    """The JSON of a cluster, kept for the last cluster object (the plan's one, shared by its configs)."""
    last = _ENCODED[0] if _ENCODED else None
    if last is not None and last[0] is cluster:
        return last[1]
    text = compact_json(cluster).encode()
    _ENCODED[:] = [(cluster, text)]
    return text


def load_object(payload: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a payload, or a ProtocolError saying what it is instead."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj
