"""A pod's followed log as a ``Channel``: what the supervisor reads is the pod log turned into frames.

One follower thread per pod reads the log through the API (with timestamps, so a stream that drops
while the container still runs is resumed without repeating lines), feeds ``PodStream``, and at the
end reads the container's exit from the pod's status. The supervisor's commands arrive on ``send``:
``go`` and ``stop`` go to the stream's barrier, and a stop (or closing a channel whose pod still
runs: the contract says the node then tears its task down) deletes the pod — the kubelet sends
SIGTERM, worker_entry stops its process group and reports, the kubelet SIGKILLs after the grace.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from worker_entry import protocol as p

from ...backends.base import Channel
from .api import KubeApi, KubeError, LogStream
from .pods import container_end
from .stream import QUARANTINE_S, ContainerEnd, PodStream

BUFFER_LIMIT = 16 << 20  # frames not yet read by the supervisor; the follower waits beyond it
MAX_RECONNECTS = 5
STATUS_WAIT_S = 5.0  # the log ends a moment before the pod's status shows the container's exit
DELETE_MARGIN_S = 3  # seconds beyond a stop's grace for worker_entry to report before the kubelet's KILL
_TS = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")

StopPod = Callable[[str, int], None]


def split_timestamp(line: bytes) -> tuple[tuple[float, int] | None, bytes]:
    """``2026-01-02T03:04:05.123456789Z text`` → ((unix seconds, nanoseconds), b"text")."""
    m = _TS.match(line)
    if m is None:
        return None, line
    try:
        zone = "+00:00" if m.group(3) == b"Z" else m.group(3).decode()
        seconds = datetime.fromisoformat(m.group(1).decode() + zone).timestamp()
    except ValueError:
        return None, line
    nanos = int((m.group(2) or b"0").ljust(9, b"0"))
    return (seconds, nanos), line[m.end() :]


class PodChannel(Channel):
    times_hello = False  # its hello is from the container's start, not an answer: no clock skew from it

    def __init__(self, task: str, pod: str, stop_pod: StopPod, grace_s: float) -> None:
        self.task = task
        self.pod = pod
        self.attempt = 0  # which attempt's pod this is (for the run directory's record)
        self.stream = PodStream(pod)
        self._stop_pod = stop_pod
        self._grace_s = grace_s
        self._cond = threading.Condition()
        self._out = bytearray()
        self._err = bytearray()
        self._eof = False
        self._eof_read = False
        self.closed = False
        self.stop_requested = False
        self.status: int | None = None
        self.end: ContainerEnd | None = None
        self.log: LogStream | None = None
        self._finishing = False
        self._timer: threading.Timer | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # --- the supervisor's side ---------------------------------------------------------------------

    def filenos(self) -> list[int]:
        return [] if self._eof_read or self.closed else [self._wake_r]

    def read(self) -> tuple[bytes, bytes, bool]:
        with self._cond:
            if not self.closed:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            out, err, eof = bytes(self._out), bytes(self._err), self._eof
            self._out.clear()
            self._err.clear()
            if eof:
                self._eof_read = True
            self._cond.notify_all()
        return out, err, eof

    def send(self, data: bytes) -> None:
        if self.closed:
            raise OSError(f"pod {self.pod}: channel closed")
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                cmd = p.parse_command(line)
            except p.ProtocolError:
                continue
            with self._cond:
                self.stream.command(cmd)
                self._push()
            if isinstance(cmd, p.Stop):
                grace = self._grace_s if cmd.grace_s is None else cmd.grace_s
                self._request_stop(grace)

    @property
    def eof_read(self) -> bool:
        """The supervisor's side has read the end of this pod's stream."""
        return self._eof_read

    def exit_status(self) -> int | None:
        if not self._eof:
            return -1 if self.closed else None
        return self.status if self.status is not None else -1

    def close(self) -> None:
        if self.closed:
            return
        if not self._eof and not self.stream.exited:
            self._request_stop(self._grace_s)  # the node tears its task down when its channel closes
        with self._cond:  # every wake-up write happens under this lock: none after the close
            self.closed = True
            self._cond.notify_all()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._timer is not None:
            self._timer.cancel()
        if self.log is not None:
            self.log.close()

    def _request_stop(self, grace_s: float) -> None:
        if self.stop_requested or self._eof:
            return
        self.stop_requested = True
        grace = math.ceil(max(0.0, grace_s)) + DELETE_MARGIN_S
        threading.Thread(target=self._stop_pod, args=(self.pod, grace), name="k8s-stop-pod", daemon=True).start()

    # --- the follower's side ---------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        with self._cond:
            while len(self._out) > BUFFER_LIMIT and not self.closed:
                self._cond.wait(1.0)
            if not self.closed:
                self.stream.feed(data)
                self._push()

    def note(self, text: str) -> None:
        with self._cond:
            self._err += f"tfcluster: {text}\n".encode()
            self._wake()

    def finish(self, end: ContainerEnd | None, external: bool = False) -> None:
        """The log is over. ``external``: someone else deleted the pod (a controller after a peer's
        failure, a user, a drain): what is left waits in quarantine for the supervisor's stop."""
        with self._cond:
            self.end = end
            if external and not self.stream.stop_received and self.stream.quarantine is None:
                self.stream.quarantine = bytearray()
            self.stream.end(end)
            self.status = end.exit_code if end is not None else None
            self._finishing = True
            self._push()

    def _release_quarantine(self) -> None:
        with self._cond:
            self.stream.release_quarantine()
            self._push()

    def _push(self) -> None:
        """Move what the stream released to the supervisor's side (EOF once nothing is quarantined)."""
        out, err = self.stream.take()
        if out or err:
            self._out += out
            self._err += err
            self._wake()
        if self.stream.quarantine is not None and self._timer is None:
            self._timer = threading.Timer(QUARANTINE_S, self._release_quarantine)
            self._timer.daemon = True
            self._timer.start()
        if self._finishing and self.stream.quarantine is None and not self._eof:
            self._eof = True
            self._wake()

    def _wake(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")


def follow(
    api: KubeApi,
    chan: PodChannel,
    *,
    read_timeout_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> None:
    """Follow ``chan.pod``'s log to its end (resuming a dropped stream), then report the exit."""
    last: tuple[float, int] | None = None  # timestamp of the newest line seen
    same = 0  # lines seen with exactly that timestamp (the kubelet's clock can repeat one)
    last_wall = 0.0
    tries = 0
    pod: dict[str, Any] | None = {}
    while not chan.closed:
        since = None if last is None else max(1, math.ceil(clock() - last_wall) + 2)
        error: Exception | None = None
        partial = b""  # a cut last line: a resumed stream repeats it whole
        skip_same = same if last is not None else 0
        try:
            chan.log = api.follow_log(chan.pod, since, read_timeout_s)
            for chunk in chan.log.chunks():
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    ts, text = split_timestamp(line)
                    if ts is not None and last is not None and (ts < last or (ts == last and skip_same > 0)):
                        skip_same -= ts == last
                        continue  # seen before the stream was resumed
                    if ts is not None:
                        same = same + 1 if ts == last else 1
                        last, last_wall = ts, clock()
                    chan.feed(text + b"\n")
                if chan.closed:
                    break
        except KubeError as exc:
            error = exc
        if chan.closed:
            return
        try:
            pod = api.read_pod(chan.pod)
        except KubeError as exc:
            error, pod = exc, {}
        # A clean end of an ended container's log is the end; a dropped stream is resumed, even of an
        # ended container (its log stays readable until the pod is deleted).
        if pod is None or (error is None and container_end(pod) is not None):
            if partial:
                chan.feed(split_timestamp(partial)[1] + b"\n")
            break
        tries += 1
        if tries > MAX_RECONNECTS:
            chan.note(f"lost the log of pod {chan.pod} ({error or 'the stream kept ending'}); giving up on it")
            break
        sleep(min(2.0**tries, 10.0))
    end = _final_status(api, chan.pod, pod, sleep, clock)
    if pod is None and end is None:
        chan.note(f"pod {chan.pod} was deleted before it reported an exit status")
    deleted = pod is None or bool(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))
    chan.finish(end, external=deleted and not chan.stop_requested)


def _final_status(
    api: KubeApi, name: str, pod: dict[str, Any] | None, sleep: Callable[[float], None], clock: Callable[[], float]
) -> ContainerEnd | None:
    deadline = clock() + STATUS_WAIT_S
    while True:
        end = container_end(pod) if pod else None
        if end is not None or pod is None or clock() >= deadline:
            return end
        sleep(0.5)
        try:
            pod = api.read_pod(name)
        except KubeError:
            pod = {}
