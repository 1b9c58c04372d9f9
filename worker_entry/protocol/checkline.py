"""The ``TFCLUSTER_CHECK {json}`` line a node's check prints (``worker_entry.check``), as validated records.

The launcher reads it from the task's log and judges every host by it (``orchestrator.job.checkjudge``),
so it is a message from a node like any other: typed, every number in a range (JSON's NaN and
Infinity, which ``json.loads`` accepts, are refused with the rest), every list bounded. A line that
does not validate is that node's ``no_result``, with the field it got wrong; it never reaches the
judgement. What a node may *claim* (its own links only) is the launcher's to enforce
(``orchestrator.job.checkclaims``): the schema says what is well-formed, not what is true.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from .frames import ProtocolError
from .schema import COUNT_MAX, LONG, S_MAX, Record, spec

PREFIX = "TFCLUSTER_CHECK "
#: a line per phase the check reached, as it reaches it: what the launcher knows of a node that never
#: printed its result (stopped with the others, or its deadline passed while it waited)
PHASE_PREFIX = "TFCLUSTER_CHECK_PHASE "
#: the check's phases in order (``worker_entry.check``): each is reached when the step it names is done
PHASES = ("started", "links", "tensorflow", "strategy", "joined", "compute", "allreduce")
#: the longest line the launcher parses (a check line is a few KiB; 4,096 links would be ~1 MiB)
MAX_LINE = 1 << 20
#: bytes/s: 100 TB/s, beyond any NIC or loopback
BPS_MAX = 1e14
#: GFLOP/s: 100 PFLOP/s on one device, beyond any GPU
GFLOPS_MAX = 1e8
TASK = spec(max_len=64)
RANK = spec(lo=0, hi=1 << 20)
ROUND = spec(lo=1, hi=16)


@dataclass
class CheckLink(Record):
    """A link this task measured as the probe's client (``a`` is the sender, ``b`` its partner)."""

    a: str = field(metadata=TASK)
    b: str = field(metadata=TASK)
    latency_s: float = field(metadata=spec(lo=0, hi=S_MAX))
    bandwidth_Bps: float = field(metadata=spec(lo=0, hi=BPS_MAX))
    round: int = field(default=1, metadata=ROUND)
    ra: int | None = field(default=None, metadata=RANK)
    rb: int | None = field(default=None, metadata=RANK)
    up_Bps: float | None = field(default=None, metadata=spec(lo=0, hi=BPS_MAX))
    down_Bps: float | None = field(default=None, metadata=spec(lo=0, hi=BPS_MAX))


@dataclass
class ServedProbe(Record):
    """What this task saw as the *server* of a probe (``b`` is the sender): the upload's rate, timed on
    its own clock. The launcher holds the client's figure to it, so one end alone cannot inflate a link."""

    a: str = field(metadata=TASK)
    b: str = field(metadata=TASK)
    up_Bps: float = field(metadata=spec(lo=0, hi=BPS_MAX))
    round: int = field(default=1, metadata=ROUND)


@dataclass
class CheckGpu(Record):
    device: str = field(metadata=spec(max_len=128))
    gflops: float = field(metadata=spec(lo=0, hi=GFLOPS_MAX))


@dataclass
class CheckAllreduce(Record):
    bytes: int = field(metadata=spec(lo=1, hi=COUNT_MAX))
    latency_s: float = field(metadata=spec(lo=0, hi=S_MAX))
    iterations: int | None = field(default=None, metadata=spec(lo=0, hi=1 << 20))


@dataclass
class CheckReport(Record):
    """One node's check line. ``error``: why its check ended without every figure."""

    task: str | None = field(default=None, metadata=TASK)
    rank: int | None = field(default=None, metadata=RANK)
    hostname: str | None = field(default=None, metadata=spec(max_len=253))
    links: list[CheckLink] = field(default_factory=list, metadata=spec(max_len=64))
    served: list[ServedProbe] = field(default_factory=list, metadata=spec(max_len=64))
    links_error: str | None = field(default=None, metadata=spec(max_len=LONG))
    links_s: float | None = field(default=None, metadata=spec(lo=0, hi=S_MAX))
    probe_bind: str | None = field(default=None, metadata=spec(max_len=300))
    probe_refused: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))  # strangers closed unheard
    communication: str | None = field(default=None, metadata=spec(max_len=32))
    device: Literal["CPU", "GPU"] | None = None
    gflops: float | None = field(default=None, metadata=spec(lo=0, hi=GFLOPS_MAX))
    gpus: list[CheckGpu] = field(default_factory=list, metadata=spec(max_len=1024))
    allreduce: list[CheckAllreduce] = field(default_factory=list, metadata=spec(max_len=64))
    workers: int | None = field(default=None, metadata=spec(lo=1, hi=1 << 20))
    done_barrier: str | None = field(default=None, metadata=spec(max_len=300))
    wall_s: float | None = field(default=None, metadata=spec(lo=0, hi=S_MAX))
    error: str | None = field(default=None, metadata=spec(max_len=LONG))


@dataclass
class CheckPhase(Record):
    """A phase the node's check reached, ``t_s`` seconds after it started (its own clock)."""

    phase: Literal["started", "links", "tensorflow", "strategy", "joined", "compute", "allreduce"]
    t_s: float = field(default=0.0, metadata=spec(lo=0, hi=S_MAX))


def find_line(text: str) -> str | None:
    """The last ``TFCLUSTER_CHECK`` payload in a task's log text (None: there is none)."""
    for line in reversed(text.splitlines()):
        if line.startswith(PREFIX):
            return line[len(PREFIX) :]
    return None


def parse_report(payload: str) -> CheckReport:
    """The validated report, or one ``ProtocolError`` saying what is wrong with it."""
    if len(payload) > MAX_LINE:
        raise ProtocolError(f"the line is {len(payload)} characters long (at most {MAX_LINE})")
    try:
        obj: Any = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected a JSON object, got {type(obj).__name__}")
    return CheckReport.from_dict(obj)


def last_phase(text: str) -> CheckPhase | None:
    """The last valid phase line in a task's log text (None: none; an invalid one is skipped: a phase is
    evidence of progress, and a node's garbage must not move it)."""
    for line in reversed(text.splitlines()):
        if line.startswith(PHASE_PREFIX):
            try:
                obj = json.loads(line[len(PHASE_PREFIX) : len(PHASE_PREFIX) + 200])
                if isinstance(obj, dict):
                    return CheckPhase.from_dict(obj)
            except (ValueError, RecursionError, ProtocolError):
                continue
    return None
