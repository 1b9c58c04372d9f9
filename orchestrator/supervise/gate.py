"""The gate before the go: compare every node's facts (versions, Keras, GPUs, ports, clocks, disk).

MWMS cannot recover from a version mismatch or a busy port once TensorFlow started, so a blocking
finding stops the job before any training command runs (nothing ran: exit code 4).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.result import Failure
from ..events import EventBus
from ..events.kinds import HeterogeneousGpus, Preflight
from ..plan import Plan
from ..spec import ClusterSpec
from .checks import evaluate, failed
from .session import TaskSession


def check_before_go(
    ready: Sequence[TaskSession], spec: ClusterSpec, plan: Plan, bus: EventBus, *, report: bool, attempt: int
) -> Failure | None:
    """Evaluate the cross-host checks; emit the ``preflight`` event (when ``report``); the failure
    that must stop the job, or None."""
    facts = {s.task: s.facts for s in ready if s.facts is not None}
    # a pod's hello is from its container's start, not an answer to us: no skew can be read from it
    skews = {s.task: s.skew_s for s in ready if s.skew_s is not None and getattr(s.channel, "times_hello", False)}
    findings = evaluate(
        facts,
        {s.task: s.host for s in ready},
        legacy_keras=spec.tensorflow.legacy_keras,
        gpus=plan.nodes[0].gpus,
        skews=skews,
    )
    blocking = [f for f in findings if f.blocks]
    warnings = [f for f in findings if failed(f) and not f.blocks]
    for f in findings:
        if f.code == "gpus" and failed(f):
            bus.emit(HeterogeneousGpus(message=f.message))
    if not report:
        return None
    bus.emit(
        Preflight(
            ok=not blocking,
            summary="; ".join(f"{f.task or 'all'}: {f.message}" for f in blocking + warnings),
            findings=[f.to_dict() for f in findings if failed(f)],
            warnings=len(warnings),
        )
    )
    if not blocking:
        return None
    first = blocking[0]
    msg = "; ".join(
        f"{f.task or 'all'} ({f.host or '-'}): {f.message}" + (f" — fix: {f.hint}" if f.hint else "") for f in blocking
    )
    return Failure("preflight", msg, time.time(), first.task, first.host, attempt=attempt)
