"""The node config and every message between the launcher and worker_entry, as validated records.

Plain (not frozen) dataclasses: frozen ones cost 2.3x at import, which every worker_entry start pays;
treat them as values all the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .config import TaskRef, load_object
from .frames import ProtocolError
from .metrics import CHECKPOINT_MAX, METRIC_LIMIT, METRICS_MAX, check_metric_names
from .plainread import read_plain
from .samples import GpuSample, HostSample
from .schema import COUNT_MAX, ID_MAX, LONG, MB_MAX, MS_MAX, S_MAX, STR, TS_MAX, Record, spec
from .training import GradNoise, Progress

#: A file's mtime in ns: any 64-bit value (before 1970 is negative).
MTIME_NS = spec(lo=-(1 << 63), hi=(1 << 63) - 1)


# ----------------------------------------------------------------------------- node → launcher


class Message(Record):
    """A message; ``TYPE`` is its ``"type"`` on the wire."""

    TYPE: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, **super().to_dict()}


@dataclass
class NodeProblem(Record):
    check: str
    message: str = field(metadata=spec(max_len=LONG))
    fix: str = field(default="", metadata=spec(max_len=LONG))


@dataclass
class GpuInfo(Record):
    index: int = field(metadata=spec(lo=0, hi=1024))
    name: str = ""
    memory_mb: int = field(default=0, metadata=spec(lo=0, hi=MB_MAX))


@dataclass
class DiskInfo(Record):
    path: str
    free_bytes: int = field(metadata=spec(lo=0, hi=COUNT_MAX))


@dataclass
class NodeFacts(Record):
    """What a node says about itself in its hello (compared across hosts before the go)."""

    hostname: str = ""
    python: str = ""
    executable: str = ""
    platform: str = ""
    packages: dict[str, str | None] = field(default_factory=dict)
    gpus: list[GpuInfo] = field(default_factory=list)
    cpus: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    # the kernel's boot id: two "hosts" with the same one share one machine's cores (namespaces, pods on a node)
    boot_id: str | None = field(default=None, metadata=spec(max_len=64))
    mem_total_mb: int | None = field(default=None, metadata=spec(lo=0, hi=MB_MAX))
    load1: float = field(default=0.0, metadata=spec(lo=0, hi=S_MAX))
    disk: DiskInfo | None = None
    time: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))
    problems: list[NodeProblem] = field(default_factory=list)
    warnings: list[NodeProblem] = field(default_factory=list)


@dataclass
class Hello(Message):
    TYPE: ClassVar[str] = "hello"
    pid: int = field(metadata=spec(lo=1, hi=ID_MAX))
    remote_dir: str
    facts: NodeFacts = field(default_factory=NodeFacts)
    task: TaskRef | None = None  # who the node thinks it is (checked against the channel's task)
    # where this task's TF server listens (its own entry of TF_CONFIG's cluster) and the scheduler's name
    # for its node (SLURMD_NODENAME): what a restart in place needs to start it again at the same place
    tf_endpoint: str | None = field(default=None, metadata=spec(max_len=300))
    node_name: str | None = field(default=None, metadata=spec(max_len=253))


@dataclass
class Heartbeat(Message):
    TYPE: ClassVar[str] = "heartbeat"
    seq: int = field(metadata=spec(lo=0, hi=COUNT_MAX))
    ts: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))
    state: str | None = field(default=None, metadata=spec(max_len=32))  # the training process; "waiting" before go
    cpu_pct: float | None = field(default=None, metadata=spec(lo=0, hi=1e7))  # 100 000 cores busy
    cpu_s: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    rss_mb: float | None = field(default=None, metadata=spec(lo=0, hi=MB_MAX))
    threads: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    nproc: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    load1: float | None = field(default=None, metadata=spec(lo=0, hi=S_MAX))
    gpus: list[GpuSample] | None = None
    progress: Progress | None = None
    host: HostSample | None = None


@dataclass
class Spawned(Message):
    TYPE: ClassVar[str] = "spawned"
    pid: int = field(metadata=spec(lo=1, hi=ID_MAX))


@dataclass
class Started(Message):
    TYPE: ClassVar[str] = "started"
    how: Literal["tf_server", "strategy", "progress"]


@dataclass
class StrategyInfo(Message):
    TYPE: ClassVar[str] = "strategy"
    communication: str = field(default="", metadata=spec(max_len=32))
    timeout_s: float | None = field(default=None, metadata=spec(lo=0, hi=S_MAX))


@dataclass
class Profile(Message):
    """One step-clock window: per step, the parts of a step (trimmed means, ``input`` + ``compute`` +
    ``collective`` + ``update`` + ``host`` + ``other`` = ``step``); see docs/instrumentation.md."""

    TYPE: ClassVar[str] = "profile"
    steps: int = field(metadata=spec(lo=0, hi=COUNT_MAX))
    ts: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))
    source: str = field(default="stepclock", metadata=spec(max_len=32))
    step_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    pre_collective_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    input_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    compute_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    collective_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    cpu_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    update_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    host_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    other_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    step_p50_ms: float | None = field(default=None, metadata=spec(lo=0, hi=MS_MAX))
    # the median step's examples across the replicas in sync (the global batch; an epoch's partial last
    # batch does not move it, where the window's mean would: `scale` tells weak from strong scaling by it)
    batch_p50: float | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    stamps: str | None = field(default=None, metadata=spec(max_len=16))  # GPU sync mode of the stamps
    # what one step all-reduces, as the strategy sees it (its traced gradient tensors): bytes, tensors,
    # IndexedSlices (all-gathered), packs (bytes_per_pack, 0: one) and the implementation asked for
    grad_bytes: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    grad_tensors: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    grad_sparse: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    grad_packs: int | None = field(default=None, metadata=spec(lo=0, hi=ID_MAX))
    bytes_per_pack: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    allreduce_impl: Literal["auto", "ring", "nccl", "mixed"] | None = None
    noise: GradNoise | None = None  # the gradient noise scale's inputs over the window (protocol.training)


@dataclass
class Evaluation(Message):
    """One evaluation by an evaluator task (``model.evaluate``, e.g. in ``SidecarEvaluator``'s loop): the metrics
    as Keras returned them, the checkpoint and its training step (the optimizer's iterations) when known."""

    TYPE: ClassVar[str] = "evaluation"
    count: int = field(metadata=spec(lo=1, hi=COUNT_MAX))  # the how-manieth evaluation of this process
    metrics: dict[str, float] = field(
        default_factory=dict, metadata=spec(lo=-METRIC_LIMIT, hi=METRIC_LIMIT, max_len=METRICS_MAX)
    )
    ts: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))
    step: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    checkpoint: str | None = field(default=None, metadata=spec(max_len=CHECKPOINT_MAX))
    source: str = field(default="evaluate", metadata=spec(max_len=32))  # sidecar: SidecarEvaluator's loop
    dropped: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))  # metrics the node left out

    def __post_init__(self) -> None:
        check_metric_names(self.metrics)


@dataclass
class Hint(Message):
    """A known mistake the instrumentation recognised in the training script, as it failed: ``code`` names
    it (the launcher owns the wording: a node sends facts, never text for the user's terminal), ``file``
    and ``line`` where in the script (the frame that made the failing call; ``file`` its base name)."""

    TYPE: ClassVar[str] = "hint"
    code: Literal["late_strategy"]
    file: str = field(default="", metadata=spec(max_len=255))
    line: int | None = field(default=None, metadata=spec(lo=1, hi=COUNT_MAX))
    ts: float = field(default=0.0, metadata=spec(lo=0, hi=TS_MAX))


@dataclass
class Stopping(Message):
    TYPE: ClassVar[str] = "stopping"
    reason: str = field(metadata=spec(max_len=LONG))


@dataclass
class Exited(Message):
    """The task is over: exit status of the training process, or why it never ran."""

    TYPE: ClassVar[str] = "exited"
    code: int | None = field(default=None, metadata=spec(lo=0, hi=255))
    signal: int | None = field(default=None, metadata=spec(lo=1, hi=128))
    signal_name: str | None = field(default=None, metadata=spec(max_len=32))
    stopped: bool = False
    reason: str | None = field(default=None, metadata=spec(max_len=LONG))
    error: str | None = field(default=None, metadata=spec(max_len=LONG))
    not_started: bool = False
    ended: float | None = field(default=None, metadata=spec(lo=0, hi=TS_MAX))


# ----------------------------------------------------------------------------- launcher → node


@dataclass
class Go(Message):
    TYPE: ClassVar[str] = "go"


@dataclass
class Ping(Message):
    TYPE: ClassVar[str] = "ping"


@dataclass
class Stop(Message):
    TYPE: ClassVar[str] = "stop"
    grace_s: float | None = field(default=None, metadata=spec(lo=0, hi=86400))
    reason: str = field(default="stopped by the launcher", metadata=spec(max_len=LONG))
    signal: int = field(default=15, metadata=spec(lo=1, hi=64))


# -------------------------------------------------------------- file transfer (gather, backup sync)


@dataclass
class FileStart(Message):
    TYPE: ClassVar[str] = "file"
    path: str = field(metadata=spec(max_len=STR))
    size: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    offset: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))
    mtime_ns: int | None = field(default=None, metadata=MTIME_NS)


@dataclass
class FileEnd(Message):
    TYPE: ClassVar[str] = "end"
    path: str = field(metadata=spec(max_len=STR))
    sha256: str = field(metadata=spec(max_len=64))
    size: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))


@dataclass
class FileError(Message):
    TYPE: ClassVar[str] = "error"
    path: str = field(metadata=spec(max_len=STR))
    error: str = field(default="", metadata=spec(max_len=LONG))


@dataclass
class Done(Message):
    TYPE: ClassVar[str] = "done"


@dataclass
class FileEntry(Record):
    path: str = field(metadata=spec(max_len=STR))
    size: int = field(metadata=spec(lo=0, hi=COUNT_MAX))
    mtime_ns: int | None = field(default=None, metadata=MTIME_NS)


@dataclass
class SkippedEntry(Record):
    path: str | None = field(default=None, metadata=spec(max_len=STR))
    reason: str = field(default="", metadata=spec(max_len=LONG))


MAX_FILES = 1_000_000


@dataclass
class Manifest(Record):
    """The regular files under one directory of a node (``worker_entry manifest``)."""

    root: str = field(metadata=spec(max_len=STR))
    exists: bool = False
    files: list[FileEntry] = field(default_factory=list, metadata=spec(max_len=MAX_FILES))
    skipped: list[SkippedEntry] = field(default_factory=list, metadata=spec(max_len=MAX_FILES))


@dataclass
class ManifestReply(Record):
    manifests: list[Manifest] = field(metadata=spec(max_len=4096))
    cleaned: dict[str, list[str]] | None = None

    @classmethod
    def parse_line(cls, line: bytes) -> ManifestReply:
        try:
            return cls.from_dict(load_object(line, "manifest"))
        except ProtocolError as exc:
            raise ProtocolError(f"manifest.{exc}", exc.field) from None


@dataclass
class TaskFiles(Message):
    """Sent once after ``exited``: what the launcher may still want, so it needs no new channel to
    learn it. ``checkpoint`` is None when not asked for, or ``checkpoint_listed`` False when the
    listing was too large for one message (the launcher then lists it separately)."""

    TYPE: ClassVar[str] = "task_files"
    task_dir: Manifest
    log_bytes: int | None = field(default=None, metadata=spec(lo=0, hi=COUNT_MAX))
    checkpoint: Manifest | None = None
    checkpoint_listed: bool = True
    cleaned: list[str] = field(default_factory=list, metadata=spec(max_len=4096))


@dataclass
class FileRequest(Record):
    path: str = field(metadata=spec(max_len=STR))
    offset: int = field(default=0, metadata=spec(lo=0, hi=COUNT_MAX))


@dataclass
class Fetch(Message):
    """After ``task_files``: stream these files of ``root`` on this channel (file/end/error, done)."""

    TYPE: ClassVar[str] = "fetch"
    root: str = field(metadata=spec(max_len=STR))
    files: list[FileRequest] = field(default_factory=list, metadata=spec(max_len=MAX_FILES))


@dataclass
class Bye(Message):
    """The launcher needs nothing more from this task: worker_entry may exit."""

    TYPE: ClassVar[str] = "bye"


#: Messages a running task may send (MSG frames on its channel).
NODE_MESSAGES: dict[str, type[Message]] = {
    m.TYPE: m
    for m in (Hello, Heartbeat, Spawned, Started, StrategyInfo, Profile, Evaluation, Hint, Stopping, Exited, TaskFiles)
}
#: Messages the launcher writes to heartbeats.jsonl, one line each: read by ``parse(loads=...)`` with
#: their record (``plainread.read_plain``: the fields that are not None, nested records as dicts), kept on
#: the message as ``_record`` — what the launcher's ``record_of`` converted back from the message before.
RECORDED = frozenset({Heartbeat, Profile})
#: Commands the launcher sends to a running task.
COMMANDS: dict[str, type[Message]] = {m.TYPE: m for m in (Go, Ping, Stop, Fetch, Bye)}
#: Messages of a file transfer (``worker_entry send`` / ``receive``).
TRANSFER_MESSAGES: dict[str, type[Message]] = {m.TYPE: m for m in (FileStart, FileEnd, FileError, Done)}


def parse(
    payload: bytes,
    table: dict[str, type[Message]],
    what: str = "message",
    loads: Callable[[bytes], Any] | None = None,
    read: Callable[[bytes], Any] | None = None,
) -> Message:
    """One message from a JSON payload, validated; ProtocolError naming the field otherwise.

    ``loads``: a faster decoder the caller trusts to give ``json.loads``'s value for what it accepts
    (the launcher's orjson, ``orchestrator.core.fastjson``; worker_entry itself imports nothing outside
    the standard library). Whatever goes wrong with it — the decoder refuses the payload, or the
    message it gives fails validation — the payload is read again with ``json``, which decides: the
    outcome and the error are the standard library's. ``read``: a faster reader of ``RECORDED`` messages
    (the launcher's msgspec, ``orchestrator.core.fastdecode``) that answers ``(message, record)`` only for
    what the checks accept, with their values, else None: then the payload is read as without it."""
    if read is not None and (got := read(payload)) is not None and table.get(got[0].TYPE) is type(got[0]):
        got[0].__dict__["_record"] = got[1]
        return got[0]  # type: ignore[no-any-return]
    if loads is not None:
        try:
            obj = loads(payload)
            cls = table.get(obj.get("type")) if type(obj) is dict else None
            if cls in RECORDED:  # read with its record, in one pass (``record_of``)
                msg, record = read_plain(cls, obj, drop_none=True)
                msg.__dict__["_record"] = record
                return msg  # type: ignore[no-any-return]
            if cls is not None:
                return cls.from_dict(obj)
        except Exception:  # read again below, by the rules that decide
            pass
    obj = load_object(payload, what)
    kind = obj.get("type")
    cls = table.get(kind) if isinstance(kind, str) else None
    if cls is None:
        allowed = ", ".join(sorted(table))
        raise ProtocolError(f"unknown {what} type {str(kind)[:40]!r} (allowed: {allowed})", "type")
    try:
        return cls.from_dict(obj)
    except ProtocolError as exc:
        raise ProtocolError(f"{cls.TYPE}.{exc}", f"{cls.TYPE}.{exc.field}") from None
    except (ArithmeticError, TypeError, ValueError, RecursionError) as exc:  # never more than a ProtocolError
        raise ProtocolError(f"{cls.TYPE}: invalid message ({type(exc).__name__})", cls.TYPE) from None


def parse_message(
    payload: bytes, loads: Callable[[bytes], Any] | None = None, read: Callable[[bytes], Any] | None = None
) -> Message:
    return parse(payload, NODE_MESSAGES, loads=loads, read=read)


def parse_command(line: bytes) -> Message:
    if "op" in (obj := load_object(line, "command")) and "type" not in obj:  # protocol 1 spelling
        obj["type"] = obj.pop("op")
        line = json.dumps(obj).encode()
    return parse(line, COMMANDS, "command")
