"""What the parts of a running job see of it (``Job`` is one): the hooks a scheduler adds and the
transfers read and extend the run through this, not through the ``Job`` class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..backends import Backend
from ..core.result import RunResult
from ..events import EventBus
from ..plan import Plan
from ..runs import RunDir
from ..spec import ClusterSpec
from ..supervise import Interrupt
from .options import LaunchOptions

if TYPE_CHECKING:
    from ..sinks import LogRouter


class RunContext(Protocol):
    spec: ClusterSpec
    plan: Plan
    opts: LaunchOptions
    backend: Backend
    rundir: RunDir
    result: RunResult
    interrupt: Interrupt
    bus: EventBus
    logs: LogRouter

    def stop_live(self) -> None: ...
