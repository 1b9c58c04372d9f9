"""Events of the launcher's defences: what a node, a pod or a neighbour did that it refused or bounded.

Each says what was refused and why, so a run's record shows every attempt it survived (docs/events.md;
docs/security.md says what each defence defends). Part of ``kinds.EVENT_TYPES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .base import COUNT, TEXT, BaseEvent


@dataclass(frozen=True, kw_only=True)
class NodeProtocolError(BaseEvent):
    """A node sent something the protocol does not allow: that task fails, the job tears down."""

    KIND: ClassVar[str] = "protocol_error"
    message: str = field(metadata=TEXT)


@dataclass(frozen=True, kw_only=True)
class ConnectionRefused(BaseEvent):
    """The connect-back port refused connections (no proof of the run's secret, a wrong rank, a
    handshake too slow or malformed): the first at once, then at most one event per 10 s summing up
    ``count`` refusals since the last one, ``peer`` and ``reason`` those of the first of them."""

    KIND: ClassVar[str] = "connection_refused"
    peer: str
    reason: str = field(metadata=TEXT)
    count: int = field(metadata=COUNT)
    total: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class LogCut(BaseEvent):
    """A task printed more than ``logs.max_bytes_per_task``: the launcher keeps no more of its lines
    (its node keeps its own log); the task runs on."""

    KIND: ClassVar[str] = "log_cut"
    message: str = field(metadata=TEXT)
    limit: int = field(metadata=COUNT)
    attempt: int = field(metadata=COUNT)


@dataclass(frozen=True, kw_only=True)
class PodIgnored(BaseEvent):
    """Kubernetes: a pod carries the job's labels but was not made by the objects this launcher created
    (its owner chain does not lead to their uids): not followed, once per pod."""

    KIND: ClassVar[str] = "pod_ignored"
    message: str = field(metadata=TEXT)
    pod: str
    owner: str | None


#: The kinds of this module, in the order of docs/events.md.
DEFENCES = (NodeProtocolError, ConnectionRefused, LogCut, PodIgnored)
