"""One pod's log → the byte stream a ``TaskSession`` reads: frames, as if it came over SSH.

What a pod prints is untrusted input. Each line is bounded (``MAX_LINE``); a line with the message
marker (``worker_entry.protocol.podlog``) is validated as a protocol message here — a malformed one
is dropped and noted in the task's log (a pod log can lose or cut a line; that must not end a job),
while a well-formed message in the wrong order still fails the task in the session, as over SSH.
Lines before worker_entry's hello are its own output (a missing module, a bad config): they go to
the session's stderr, where the diagnosis of a task that never started looks.

Pods start on their own — nobody sends them a go — but the supervisor gives its go only when every
task has said hello. So ``PodStream`` plays the barrier: after the hello it holds the pod's frames
until the supervisor's ``go`` (then releases them in order). A stop before the go releases them
without the ``spawned`` the session cannot accept before a go; a pod that ends before the go is
released with what a ready task may report (output, heartbeats, its exit). Held output is bounded.

A pod Kubernetes itself terminates (the JobSet or Job controller deleting the peers of a failed pod,
a drain) reports ``stopping`` on SIGTERM without any stop from the supervisor. Its failure is a
symptom: the peer that failed first is the root cause. So from such a ``stopping`` on, its frames
are quarantined until the supervisor's own stop arrives (then it is one of the tasks the teardown
stopped) or ``release_quarantine`` is called after ``QUARANTINE_S`` (then it is a failure after all).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from worker_entry import protocol as p
from worker_entry.protocol.podlog import decode_line

from ...core import fastdecode, fastjson

MAX_LINE = (4 << 20) - 1  # with its newline: the protocol's largest LOG frame
HOLD_LIMIT = 8 << 20  # output held before the go (the oldest is dropped beyond it; kubectl logs keeps it)
MAX_NOTES = 5  # notes about malformed lines per pod, then one count at the end
QUARANTINE_S = 2.0  # how long an unrequested stop waits for the supervisor's own stop
#: What a task that has said hello but got no go may report (``session._ALLOWED[READY]`` minus spawned).
_BEFORE_GO = frozenset({None, "heartbeat", "stopping", "exited"})


@dataclass(frozen=True)
class ContainerEnd:
    """How the pod's container ended, from the pod's status (the authority when worker_entry could
    not say it itself: OOM kill, eviction, SIGKILL after the grace period)."""

    pod: str
    exit_code: int | None
    reason: str | None = None
    message: str | None = None

    def describe(self) -> str:
        text = f"pod {self.pod}: container ended"
        if self.reason:
            text += f" ({self.reason})"
        if self.exit_code is not None:
            text += f" with exit code {self.exit_code}"
        if self.message:
            text += f": {self.message.strip()[:500]}"
        return text


class PodStream:
    def __init__(self, pod: str = "", hold_limit: int = HOLD_LIMIT) -> None:
        self.pod = pod
        self.hold_limit = hold_limit
        self._out = bytearray()
        self._err = bytearray()
        self._partial = bytearray()
        self.hello = False
        self.go = False
        self.stopped = False
        self.released_early = False
        self.exited = False
        self._held: list[tuple[str | None, bytes]] = []
        self._held_log_bytes = 0
        self.dropped_bytes = 0
        self.bad_lines = 0
        self.stop_received = False
        self.quarantine: bytearray | None = None  # frames after a stop nobody asked for

    # --- input -----------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Raw log bytes (timestamps already removed); complete lines are processed, a "line" longer
        than ``MAX_LINE`` (a progress bar without newlines) in pieces."""
        self._partial += data
        while True:
            nl = self._partial.find(b"\n")
            if 0 <= nl <= MAX_LINE:
                line = bytes(self._partial[:nl])
                del self._partial[: nl + 1]
            elif len(self._partial) > MAX_LINE:
                line = bytes(self._partial[:MAX_LINE])
                del self._partial[:MAX_LINE]
            else:
                return
            self.line(line)

    def line(self, line: bytes) -> None:
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE]
        is_msg, payload = decode_line(line)
        if not is_msg:
            self._output(payload + b"\n")
            return
        try:
            msg = p.parse_message(payload, fastjson.loads, fastdecode.READ)  # the channel's readers: same outcomes
        except p.ProtocolError as exc:
            self._bad(str(exc))
            return
        self.message(msg, payload)

    def message(self, msg: p.Message, payload: bytes | None = None) -> None:
        if not self.hello:
            if not isinstance(msg, p.Hello):
                self._bad(f"{msg.TYPE!r} before worker_entry's hello")
                return
            # The hello may be minutes old when the launcher reads it: no round trip to measure a
            # clock skew against, so the session must not compute one.
            msg.facts.time = 0.0
            self.hello = True
            self._out += p.MARKER + p.msg_frame(msg)
            return
        if self.exited:
            self._bad(f"{msg.TYPE!r} after 'exited'")
            return
        self.exited = isinstance(msg, p.Exited)
        frame = p.HEADER.pack(p.T_MSG, 0, len(payload)) + payload if payload is not None else p.msg_frame(msg)
        self._emit(msg.TYPE, frame)

    def command(self, cmd: p.Message) -> None:
        """The supervisor's go or stop (a ping means nothing to a pod)."""
        if isinstance(cmd, p.Go) and not self.go and not self.stopped:
            self.go = True
            self._release(None)
        elif isinstance(cmd, p.Stop):
            self.stop_received = True
            if not self.go and not self.stopped:
                self.stopped = True
                self._release(frozenset({"spawned"}))
            self.release_quarantine()

    def release_quarantine(self) -> None:
        if self.quarantine is not None:
            self._out += self.quarantine
            self.quarantine = None

    def end(self, ended: ContainerEnd | None) -> None:
        """The log is over; report the container's end unless worker_entry did."""
        if self._partial:
            self.feed(b"\n")
        if ended is not None and not self.exited:
            self._err += ("tfcluster: " + ended.describe() + "\n").encode()
            if self.hello:
                code = ended.exit_code if ended.exit_code is not None and 0 <= ended.exit_code <= 255 else None
                self.message(p.Exited(code=code, reason=ended.reason, error=ended.describe(), ended=time.time()))
        if self.bad_lines > MAX_NOTES:
            self._note(f"{self.bad_lines} malformed protocol lines in all were ignored")
        if not self.go and not self.stopped and not self.released_early:
            self._release(frozenset({"spawned", "started", "strategy", "profile"}))

    def take(self) -> tuple[bytes, bytes]:
        """What the session may read now: (frames, worker_entry's own output)."""
        out, err = bytes(self._out), bytes(self._err)
        self._out.clear()
        self._err.clear()
        return out, err

    # --- internals -------------------------------------------------------------------------------

    def _output(self, data: bytes) -> None:
        if not self.hello:
            self._err += data
            return
        self._emit(None, p.log_frame(p.STDOUT, data))

    def _put(self, kind: str | None, frame: bytes) -> None:
        if kind == "stopping" and not self.stop_received and self.quarantine is None:
            self.quarantine = bytearray()
        if self.quarantine is not None:
            self.quarantine += frame
        else:
            self._out += frame

    def _emit(self, kind: str | None, frame: bytes) -> None:
        if self.go or self.released_early:
            if kind in _BEFORE_GO or self.go:
                self._put(kind, frame)
            return
        if self.stopped:
            if kind != "spawned":
                self._put(kind, frame)
            return
        self._held.append((kind, frame))
        if kind is None:
            self._held_log_bytes += len(frame)
            self._bound()
        if kind == "exited":  # it ended before every pod was up: the job must hear it now
            self.released_early = True
            self._release(frozenset({"spawned", "started", "strategy", "profile"}))

    def _bound(self) -> None:
        i = 0
        while self._held_log_bytes > self.hold_limit and i < len(self._held):
            kind, frame = self._held[i]
            if kind is None:
                self._held.pop(i)
                self._held_log_bytes -= len(frame)
                self.dropped_bytes += len(frame) - p.HEADER.size
            else:
                i += 1

    def _release(self, drop: frozenset[str] | None) -> None:
        if self.dropped_bytes:
            self._note(
                f"{self.dropped_bytes} bytes of this pod's output from before every pod was up are not "
                f"here (only in `kubectl logs {self.pod}`)"
            )
        for kind, frame in self._held:
            if drop is None or kind not in drop:
                self._put(kind, frame)
        self._held.clear()
        self._held_log_bytes = 0

    def _bad(self, why: str) -> None:
        self.bad_lines += 1
        if self.bad_lines <= MAX_NOTES:
            self._note(f"ignored a malformed protocol line from the pod log: {why[:300]}")

    def _note(self, text: str) -> None:
        self._err += f"tfcluster: {text}\n".encode()
