"""The node's end of a connect-back channel: worker_entry dials the supervisor (schedulers start it).

Under a scheduler (Slurm) nobody SSHes into the node: the scheduler starts ``python -m worker_entry
connect`` (or a scheduler mode built on it) with the supervisor's ``TFCLUSTER_CONNECT`` (host:port) in
its environment and the run's secret on its stdin — never in an environment, which ``/proc/PID/environ``
shows for the life of the process. It proves it holds the secret and checks that the supervisor holds
it too (``protocol.handshake``: the secret never crosses the network), receives its ``NodeConfig`` as
the first sealed record, and from then on speaks, inside sealed records (``protocol.seal``), exactly
the protocol it speaks over an SSH channel.

A node keeps dialing until its own deadline (``CONNECT_DEADLINE_S``), with a jittered backoff: a
supervisor not listening yet, a connection dropped in a flood of others, an answer that does not
prove the secret are all worth another try; only a refusal the supervisor signs (a wrong rank) ends
it at once. Needs the ``cryptography`` package (a tfcluster dependency) for the sealed records.
"""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from ...protocol import handshake as hs
from ...protocol import seal
from ...protocol.env import Env
from ...protocol.frames import MAX_CONFIG_LINE
from .relay import Link

HandshakeError = hs.HandshakeError
Refused = hs.Refused
mac = hs.mac
CONNECT_DEADLINE_S = 120.0  # how long a node keeps dialing before it gives up
ATTEMPT_TIMEOUT_S = 20.0  # one attempt, its configuration included
BACKOFF_S = (0.2, 5.0)  # between attempts: from, doubling up to
SECRET_TIMEOUT_S = 30.0  # the secret must be on stdin by then
MAX_SECRET_LINE = 1024


class _Reader:
    """Buffered reads against one deadline for the whole attempt (however the bytes trickle in)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()

    def recv(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HandshakeError("the supervisor did not complete the handshake in time")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            raise HandshakeError("the supervisor did not complete the handshake in time") from None
        if not data:
            raise HandshakeError("connection closed during the handshake")
        return data

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > hs.MAX_LINE:
                raise HandshakeError("handshake line too long: the peer is not a tfcluster supervisor")
            self.buf += self.recv()
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return line

    def rest(self) -> bytes:
        out, self.buf = bytes(self.buf), bytearray()
        return out


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{Env.CONNECT}={text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _attempt(
    address: tuple[str, int], secret: bytes, rank: int, timeout: float, reached: list[int], attempt: int = 0
) -> Link:
    """One dial: both proofs, the channel's keys, the configuration line. ``reached[0]``: how far it got
    (0 connecting, 1 connected, 2 a supervisor's hello)."""
    deadline = time.monotonic() + timeout
    reached[0] = 0
    sock = socket.create_connection(address, timeout=timeout)
    reached[0] = 1
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = _Reader(sock, deadline)
        server_nonce = hs.parse_hello(reader.line())
        reached[0] = 2
        nonce = hs.new_nonce()
        sock.sendall(hs.answer(secret, rank, server_nonce, nonce, attempt))
        hs.parse_reply(reader.line(), secret, rank, server_nonce, nonce, attempt)
        to_node, to_supervisor = seal.channel_keys(secret, server_nonce, nonce, rank)
        opener, sealer = seal.Opener(to_node), seal.Sealer(to_supervisor)
        try:
            plain = bytearray(opener.feed(reader.rest()))
            while b"\n" not in plain:
                if len(plain) > MAX_CONFIG_LINE:
                    raise HandshakeError("the configuration line is too long")
                plain += opener.feed(reader.recv())
        except seal.SealError as exc:
            raise HandshakeError(f"the configuration failed authentication: {exc}") from None
        line, _, rest = bytes(plain).partition(b"\n")
        sock.settimeout(None)
        return Link(sock, sealer, opener, line, rest)
    except BaseException:
        sock.close()
        raise


def connect_back(
    address: tuple[str, int], secret: bytes, rank: int, deadline_s: float = CONNECT_DEADLINE_S, attempt: int = 0
) -> Link:
    """Dial the supervisor until both sides are proven or ``deadline_s`` passed (then the most telling
    error of the attempts); a refusal the supervisor signed ends it at once (``Refused``). ``attempt``:
    the run's attempt this node was started for (``TFCLUSTER_ATTEMPT``), bound into its proof."""
    seal.check_available()
    end = time.monotonic() + deadline_s
    delay = BACKOFF_S[0]
    tries = 0
    telling: tuple[int, OSError] | None = None  # the error of the attempt that got furthest, the latest of those
    reached = [0]
    while True:
        tries += 1
        left = end - time.monotonic()
        try:
            return _attempt(address, secret, rank, max(0.1, min(ATTEMPT_TIMEOUT_S, left)), reached, attempt)
        except Refused:
            raise
        except OSError as exc:
            if telling is None or reached[0] >= telling[0]:
                telling = (reached[0], exc)
        left = end - time.monotonic()
        if left <= 0:
            raise HandshakeError(f"{telling[1]} (gave up after {tries} attempt{'s' * (tries > 1)} in {deadline_s:g}s)")
        time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
        delay = min(delay * 2, BACKOFF_S[1])


def read_secret(fd: int = 0, timeout: float = SECRET_TIMEOUT_S) -> bytes:
    """The run's secret: the first line on ``fd`` (stdin), hex. It is never put in the environment."""
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        try:
            sel.register(fd, selectors.EVENT_READ)
            waitable = True
        except (OSError, ValueError):  # a regular file (epoll refuses it): its reads never block
            waitable = False
        while b"\n" not in buf and len(buf) <= MAX_SECRET_LINE:
            left = deadline - time.monotonic()
            if left <= 0 or (waitable and not sel.select(left)):
                raise ValueError(f"no secret on stdin within {timeout:g}s (the launcher writes the run's secret there)")
            try:
                chunk = os.read(fd, MAX_SECRET_LINE)
            except OSError as exc:
                raise ValueError(f"cannot read the secret from stdin: {exc}") from None
            if not chunk:
                break
            buf += chunk
    line = buf.partition(b"\n")[0].strip()
    try:
        secret = bytes.fromhex(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) < 16:
        raise ValueError("expected the run's secret on stdin (one line of hex, at least 16 bytes)")
    return secret


def main(rank: int | None = None, env: Mapping[str, str] = os.environ, stdin_fd: int = 0) -> int:
    """``python -m worker_entry connect``: rank from ``TFCLUSTER_RANK`` unless given; secret on stdin."""
    from ...protocol import NodeConfig, ProtocolError

    try:
        address = parse_address(env.get(Env.CONNECT, ""))
        rank = int(env.get(Env.RANK, "")) if rank is None else rank
        secret = read_secret(stdin_fd)
        seal.check_available()
    except (ValueError, seal.CryptoUnavailable) as exc:
        print(f"worker_entry connect: {exc}", file=sys.stderr)
        return 2
    try:
        link = connect_back(address, secret, rank, attempt=dial_attempt(env))
    except OSError as exc:
        print(f"worker_entry connect: cannot reach the supervisor at {address[0]}:{address[1]}: {exc}", file=sys.stderr)
        return 3
    try:
        config = NodeConfig.parse_line(link.config_line)
    except ProtocolError as exc:
        print(f"worker_entry connect: bad configuration from the supervisor: {exc}", file=sys.stderr)
        link.sock.close()
        return 2
    share = gpu_share(env, config.gpus)
    if share is not None:
        config.env["CUDA_VISIBLE_DEVICES"] = share
    return serve(config, link)


def dial_attempt(env: Mapping[str, str]) -> int:
    """The attempt the scheduler started this node for (``TFCLUSTER_ATTEMPT``; 0 when unset)."""
    raw = env.get(Env.ATTEMPT, "0")
    return int(raw) if raw.isdigit() and len(raw) <= 4 else 0


def gpu_share(env: Mapping[str, str], per_task: int) -> str | None:
    """A Slurm task restarted in place (``TFCLUSTER_GPU_SLOT`` LOCAL/TASKS_HERE): the same share of the
    node's GPUs its first incarnation had (``protocol.cluster.gpu_slice``); None: leave them alone."""
    local, sep, here = env.get(Env.GPU_SLOT, "").partition("/")
    if not sep or not local.isdigit() or not here.isdigit() or len(local) > 6 or len(here) > 6:
        return None
    from ...protocol.cluster import gpu_slice

    return gpu_slice(env.get("CUDA_VISIBLE_DEVICES", ""), int(local), per_task, int(here))


def serve(config: Any, link: Any) -> int:
    """Run one task over a proven connect-back link: the same protocol as over stdin/stdout, sealed
    (the relay — and the hashing and cipher it needs — is imported here: an SSH task never pays for it)."""
    from ..runner import Runner
    from .relay import SealedRelay

    relay = SealedRelay(link)
    out_fd = os.dup(relay.fd)
    try:
        return Runner(config, out_fd, relay.fd).main()
    finally:
        for fd in (out_fd, relay.fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        relay.finish(30.0)


def run(argv: list[str]) -> int:
    """``python -m worker_entry connect ...`` (``agent.main`` finds this mode by its name)."""
    return main()
