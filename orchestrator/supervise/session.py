"""One live task as the launcher sees it: bytes in, typed messages out, bounded memory, its state.

A ``TaskSession`` decodes its channel's bytes (frames, login-shell noise, worker_entry's own stderr),
validates every message (``worker_entry.protocol``) and its order against the task's state, keeps the
last output lines for a root cause, and applies the state transitions a message implies. It decides
nothing about the job: the supervisor reads what ``receive`` returns and acts.

Everything a node sends is bounded here: output tail 16 KiB, worker_entry's stderr 64 KiB (the last
bytes), the decoder's buffer (by the protocol's frame limits), the login shell's preamble 64 KiB.
After the first protocol error nothing more from that node is decoded.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker_entry import protocol as p

from ..backends import Channel, Placement
from ..core import fastdecode, fastjson
from ..core.result import Failure
from ..core.states import TaskState
from ..plan import NodePlan
from .lastlines import tidy

TAIL_BYTES = 16 * 1024
DIAG_BYTES = 64 * 1024
LAST_LINES = 20
EXIT_CONFIRM_S = 10.0  # after its task ended: how long a node may take to confirm its processes are gone


PROTOCOL_HINT = (
    "the host runs a different or broken worker_entry, or something writes into its output channel; "
    "compare versions with `tfcluster preflight`"
)


@dataclass(frozen=True)
class Output:
    """Complete lines the training process printed (or worker_entry's own stderr, ``own=True``)."""

    data: bytes
    own: bool = False


@dataclass(frozen=True)
class ShellNoise:
    """What the login shell printed before worker_entry started."""

    text: str


@dataclass(frozen=True)
class Violation:
    """The node broke the protocol: the task fails with this as its cause."""

    error: str


Incoming = Output | ShellNoise | Violation | p.Message

#: Which messages a task may send in which state (the supervisor sends go in READY).
_ALLOWED: dict[TaskState, frozenset[str]] = {
    TaskState.STARTING: frozenset({"hello"}),
    TaskState.READY: frozenset({"heartbeat", "stopping", "exited", "spawned"}),
    TaskState.RUNNING: frozenset(
        {"heartbeat", "started", "strategy", "profile", "evaluation", "hint", "stopping", "exited"}
    ),
    TaskState.STOPPING: frozenset(
        {"hello", "heartbeat", "started", "strategy", "profile", "evaluation", "hint", "stopping", "exited", "spawned"}
    ),
}


class InvalidTransition(RuntimeError):
    """A task state change the table (``TaskState.can_become``) does not allow: a bug in the launcher."""


class TaskSession:
    """The live task; its ``node`` (NodePlan) is the blueprint."""

    def __init__(self, node: NodePlan, attempt: int = 0, on_terminal: Callable[[str], None] | None = None) -> None:
        self.node = node
        self.attempt = attempt
        self.on_terminal = on_terminal  # told once, when the task reaches a terminal state
        self.task = str(node.task)
        self.key = self.task  # its channel's name in the pump and the queue (TASK#N: the Nth restart in place)
        self.restarts = 0  # how many times it was restarted alone, in place, before this incarnation
        self.placement = Placement()  # where it runs, as its hello says (a restart in place starts it there)
        self.host = node.host
        self.state = TaskState.PENDING
        self.channel: Channel | None = None
        self.decoder = p.FrameDecoder()
        self.facts: p.NodeFacts | None = None
        self.pid: int | None = None
        self.started_how: str | None = None
        self.heartbeat: p.Heartbeat | None = None
        self.heartbeat_wall: float | None = None
        self.profile: p.Profile | None = None
        self.exit: p.Exited | None = None
        self.hint: p.Hint | None = None  # a known mistake its script made (the first): its failure's fix
        self.files: p.TaskFiles | None = None  # what the node offers after its task ended
        self.abandoned = False  # we stopped waiting for it: its channel is closed, nothing to fetch
        self.exit_confirmed: bool | None = None  # its node said its processes are gone (None: not asked)
        self.go_sent = False
        self.spawned = False
        self.stop_sent = False
        self.config_sent_at: float | None = None
        self.skew_s: float | None = None
        self.violation: str | None = None
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self._open_bar: set[int] = set()  # streams whose unfinished line is a progress bar being redrawn
        self._bars: collections.deque[str] = collections.deque(maxlen=16)  # bar lines among the tail's
        self._diag = bytearray()

    # --- channel --------------------------------------------------------------------------------

    def become(self, new: TaskState) -> None:
        """Every state change goes through here: checked against the one table, and a terminal state
        is reported once (the monitor stops watching the task)."""
        if new == self.state:
            return
        if not self.state.can_become(new):
            raise InvalidTransition(f"{self.task}: {self.state.value} -> {new.value}")
        self.state = new
        if new.is_terminal and self.on_terminal is not None:
            self.on_terminal(self.task)

    def attach(self, channel: Channel) -> None:
        self.channel = channel
        self.config_sent_at = time.time()
        self.become(TaskState.STARTING)

    def send(self, command: p.Message) -> bool:
        """Send a command; False when the channel is gone (its EOF tells the rest). A task that ended
        is still sent to while it hands over (pings keep its node waiting for the hand-over; ``bye``)."""
        if self.channel is None or (self.state.is_terminal and not self.handing_over):
            return False
        try:
            self.channel.send(p.command_line(command))
        except OSError:
            return False
        if isinstance(command, p.Go):
            self.go_sent = True
        return True

    def close(self) -> None:
        """Close the channel for good (worker_entry stops its task when it sees the channel go). A task
        that ended and said so is closed gracefully: its node's worker_entry exits once the task's process
        tree is gone, and its exit status is the confirmation (``exit_confirmed``), waited for up to
        ``EXIT_CONFIRM_S`` (the hand-over closes every task in parallel)."""
        graceful = self.handing_over
        self.abandoned = True
        if self.channel is not None and self.exit_confirmed is None:
            self.exit_confirmed = self.channel.close_confirmed(EXIT_CONFIRM_S if graceful else 0.0)

    @property
    def handing_over(self) -> bool:
        """The task ended and said so: its channel stays open for the hand-over (task_files, fetch, bye)."""
        return self.channel is not None and not self.abandoned and self.exit is not None and self.violation is None

    # --- bytes in --------------------------------------------------------------------------------

    def receive(self, out: bytes, err: bytes) -> list[Incoming]:
        """Decode what arrived; apply the transitions messages imply; return what the job must hear."""
        items: list[Incoming] = []
        if err:
            self._keep_diag(err)
            items.append(Output(err if err.endswith(b"\n") else err + b"\n", own=True))
        if not out or self.violation is not None:
            return items
        try:
            frames = self.decoder.feed(out)
        except p.ProtocolError as exc:
            frames = []
            self._violate(items, str(exc))
        if self.decoder.preamble:
            noise = bytes(self.decoder.preamble)
            self.decoder.preamble.clear()
            items.append(Output(noise if noise.endswith(b"\n") else noise + b"\n", own=True))
            if noise.strip():
                items.append(ShellNoise(noise.decode("utf-8", "replace").strip()))
        for fr in frames:
            if self.violation is not None:
                break
            if fr.type == p.T_LOG:
                if not fr.payload.endswith(b"\r"):  # a progress frame is no line of the task's last lines
                    self._remember(fr.payload, fr.stream)
                else:
                    self._open_bar.add(fr.stream)  # the line that ends it is a bar's (``lastlines``)
                items.append(Output(fr.payload))
            elif fr.type == p.T_MSG:
                try:
                    msg = p.parse_message(fr.payload, fastjson.loads, fastdecode.READ)
                    self._accept(msg)
                except p.ProtocolError as exc:
                    self._violate(items, str(exc))
                    break
                items.append(msg)
            else:
                self._violate(items, f"unexpected frame type {fr.type} on a task channel")
        if self.violation is None and self.decoder.failed is not None:
            self._violate(items, str(self.decoder.failed))
        return items

    def _violate(self, items: list[Incoming], error: str) -> None:
        if self.violation is None:
            self.violation = error
            items.append(Violation(error))

    def _accept(self, msg: p.Message) -> None:
        """Check the message's order and identity; update what it changes (by its ``TYPE``: the usual
        heartbeat is one dict lookup and one call away, not the last of an ``isinstance`` chain)."""
        kind = msg.TYPE
        if kind == "task_files":
            if self.exit is None or self.files is not None:
                raise p.ProtocolError("out of order: 'task_files' before 'exited', or twice")
            self.files = msg  # type: ignore[assignment]
            return
        if kind not in _ALLOWED.get(self.state, _NOTHING):
            where = f"after it {self.state.value}" if self.state.is_terminal else f"while {self.state.value}"
            raise p.ProtocolError(f"out of order: {kind!r} {where}")
        take = _TAKE.get(kind)
        if take is not None:
            take(self, msg)

    def _hello(self, msg: p.Hello) -> None:
        if self.facts is not None:
            raise p.ProtocolError("out of order: 'hello' twice")
        if msg.task is not None and str(msg.task) != self.task:
            raise p.ProtocolError(f"hello.task: this channel is {self.task}, the node claims {msg.task}")
        self.facts = msg.facts
        self.placement = Placement(msg.tf_endpoint, msg.node_name)
        if self.config_sent_at is not None and msg.facts.time:
            self.skew_s = msg.facts.time - (self.config_sent_at + time.time()) / 2
        self.pid = msg.pid
        if self.state == TaskState.STARTING:
            self.become(TaskState.READY)

    def _spawned(self, msg: p.Spawned) -> None:
        if not self.go_sent or self.facts is None or self.spawned:
            raise p.ProtocolError("out of order: 'spawned' before the go, or twice")
        self.spawned = True
        self.pid = msg.pid
        self.become(TaskState.STOPPING if self.stop_sent else TaskState.RUNNING)

    def _started(self, msg: p.Started) -> None:
        if self.started_how is not None:
            raise p.ProtocolError("out of order: 'started' twice")
        self.started_how = msg.how

    def _heartbeat(self, msg: p.Heartbeat) -> None:
        self.heartbeat = msg
        self.heartbeat_wall = time.time()

    def _profile(self, msg: p.Profile) -> None:
        self.profile = msg

    def _hint(self, msg: p.Hint) -> None:
        self.hint = self.hint or msg

    def _exited(self, msg: p.Exited) -> None:
        self.exit = msg

    def finish(self, exited: p.Exited, job_stopping: bool, failing: bool = False) -> TaskState:
        """The terminal state an ``exited`` message means; ``failing``: the job is torn down for a
        failure (then a task that ended on its own before its stop took effect failed too)."""
        if exited.not_started:
            self.become(TaskState.NOT_STARTED)
        elif exited.code == 0:
            self.become(TaskState.SUCCEEDED)
        elif failing and self.stop_sent and not exited.stopped and exited.reason is None and exited.signal is None:
            # told to stop, but its node says it ended on its own first (a peer's collective error, say):
            # failed, with its real exit (status used to call it "stopped EXIT 1")
            self.become(TaskState.FAILED)
        elif self.stop_sent or (exited.stopped and job_stopping):
            self.become(TaskState.STOPPED)
        else:
            self.become(TaskState.FAILED)
        return self.state

    # --- what it printed -----------------------------------------------------------------------

    def _remember(self, data: bytes, stream: int | None = None) -> None:
        if stream in self._open_bar:  # its first line ends the bar that was being redrawn
            self._open_bar.discard(stream)
            self._bars.append(data.split(b"\n", 1)[0].decode("utf-8", "replace").strip())
        self._tail.append(data)
        self._tail_bytes += len(data)
        while self._tail_bytes > TAIL_BYTES and len(self._tail) > 1:
            self._tail_bytes -= len(self._tail.popleft())

    def _keep_diag(self, data: bytes) -> None:
        self._diag += data
        if len(self._diag) > DIAG_BYTES:
            del self._diag[: len(self._diag) - DIAG_BYTES]

    @property
    def diag_text(self) -> str:
        """worker_entry's own stderr (and the shell's), the last 64 KiB."""
        return self._diag.decode("utf-8", "replace")

    def failure(self, kind: str, message: str, **fields: Any) -> Failure:
        """A failure of this task's attempt, attributed to it, with its last output lines (unless given)."""
        fields.setdefault("last_lines", self.last_lines())
        return Failure(kind, message, time.time(), self.task, self.host, attempt=self.attempt, **fields)

    def last_lines(self, n: int = LAST_LINES) -> tuple[str, ...]:
        text = b"".join(self._tail)[-TAIL_BYTES:].decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines and self._diag:
            lines = [ln for ln in self.diag_text.splitlines() if ln.strip()]
        return tuple(line[:1000] for line in tidy(lines, self._bars)[-n:])  # bars before the traceback


_NOTHING: frozenset[str] = frozenset()
#: What each message changes in its session, by its ``TYPE`` (after its order was checked).
_TAKE: dict[str, Callable[[TaskSession, Any], None]] = {
    "hello": TaskSession._hello,
    "spawned": TaskSession._spawned,
    "started": TaskSession._started,
    "heartbeat": TaskSession._heartbeat,
    "profile": TaskSession._profile,
    "hint": TaskSession._hint,
    "exited": TaskSession._exited,
}


def record_of(m: p.Message) -> dict[str, Any]:
    """A message as a heartbeats.jsonl record (without its type, without empty fields): the one its
    reader built as it validated it (``protocol.RECORDED``), else converted from the message. Shared,
    not copied: whoever changes it copies it first."""
    record = m.__dict__.get("_record")
    if record is not None:
        return record  # type: ignore[no-any-return]
    return {k: v for k, v in p.Record.to_dict(m).items() if v is not None}  # the fields alone: no "type"
