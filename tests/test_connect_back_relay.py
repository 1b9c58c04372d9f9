"""The connect-back channel through a hostile relay, with real sockets and real worker_entry processes:
everything after the handshake is sealed — a relayed connection cannot read the configuration, nor
inject, replay or rewrite a byte in either direction; the secret is not in any process's environment.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netattack import Relay
from supervising import Recorder
from test_connect_back import REPO, LocalNodes, real_plan

from orchestrator.core.states import JobState
from orchestrator.events import EventBus
from orchestrator.supervise import Interrupt, Supervisor
from worker_entry import protocol as p
from worker_entry.protocol import seal

SECRET = b"s" * 32
CONFIG = p.NodeConfig(argv=["true"], remote_dir="/tmp/x", env={"API_TOKEN": "tok-do-not-leak"})


class RelayedNodes(LocalNodes):
    """Local nodes; rank 0 dials through ``relay``."""

    relay: Relay

    def launch(self, starts) -> None:
        for rank, _ in enumerate(starts):
            port = self.relay.port if rank == 0 else self.server.port
            env = {**os.environ, p.Env.CONNECT: f"127.0.0.1:{port}", p.Env.RANK: str(rank), "PYTHONPATH": str(REPO)}
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker_entry", "connect"],
                env=env,
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            proc.stdin.write(self.secret_input())
            proc.stdin.close()
            self.procs.append(proc)


def run_through_relay(tmp_path: Path, direction: str | None, forge) -> tuple:
    """Two real nodes; worker:0's connection goes through an on-path relay that injects ``forge(relay)``
    into ``direction`` once worker:0's hello (its first sealed record) has passed."""
    marker = tmp_path / "ran"
    code = f"import os, pathlib; i = os.environ['TFCLUSTER_TASK_INDEX']; pathlib.Path({str(marker)!r} + i).touch()"
    loaded, plan = real_plan(2, command=[sys.executable, "-c", code])
    backend = RelayedNodes()
    relay = backend.relay = Relay(("127.0.0.1", backend.server.port))
    if direction is not None:  # once worker:0's sealed hello (a few hundred bytes) is through
        relay.inject(direction, forge, lambda r: len(r.seen[Relay.TO_SUPERVISOR]) > 200)
    rec = Recorder()
    sup = Supervisor(
        loaded.spec, plan, backend, attempt=0, bus=EventBus([rec]), logs=rec, heartbeats=rec, interrupt=Interrupt()
    )
    try:
        res = sup.run()
    finally:
        relay.close()  # first: worker:0's node sees its connection end now, not after its ping timeout
        backend.close()
    errs = [proc.stderr.read().decode() for proc in backend.procs]
    return res, relay, errs


def _record(data: bytes) -> bytes:
    """A well-formed record whose tag is not the key holder's."""
    return seal.HEADER.pack(len(data) + seal.TAG) + data + secrets.token_bytes(seal.TAG)


def _first_sealed_record_to_node(r: Relay) -> bytes:
    """The supervisor's first record to this node (its configuration), replayed."""
    stream = bytes(r.seen[Relay.TO_NODE])
    start = stream.index(b"\n", stream.index(b"\n") + 1) + 1  # after the hello and the accept lines
    (size,) = seal.HEADER.unpack_from(stream, start)
    return stream[start : start + seal.HEADER.size + size]


@pytest.mark.parametrize(
    ("direction", "forge", "what"),
    [
        (Relay.TO_NODE, lambda r: p.command_line(p.Go()), "a plain go"),
        (Relay.TO_NODE, lambda r: _record(p.command_line(p.Go())), "a forged record"),
        (Relay.TO_NODE, _first_sealed_record_to_node, "a replayed record"),
        (Relay.TO_SUPERVISOR, lambda r: p.msg_frame(p.Exited(code=0, ended=time.time())), "a plain exited"),
        (Relay.TO_SUPERVISOR, lambda r: _record(p.msg_frame(p.Exited(code=0))), "a forged record"),
    ],
)
def test_a_relayed_connection_cannot_inject_or_replay_in_either_direction(tmp_path, direction, forge, what):
    res, relay, errs = run_through_relay(tmp_path, direction, forge)
    assert relay.injected.is_set(), what
    assert res.state != JobState.SUCCEEDED
    assert not (tmp_path / "ran0").exists()  # worker:0's command never ran: nothing unauthenticated was obeyed
    assert res.tasks["worker:0"].state.value in ("lost", "failed", "not_started", "stopped")
    if direction == Relay.TO_NODE:
        assert "failed authentication" in errs[0] or "malformed record" in errs[0], errs[0]
    else:
        said = " ".join(res.root_cause.last_lines)
        assert res.root_cause.task == "worker:0" and ("failed authentication" in said or "malformed record" in said)


def test_a_relay_sees_no_configuration_and_a_clean_run_through_it_succeeds(tmp_path):
    res, relay, _ = run_through_relay(tmp_path, None, None)
    assert res.state == JobState.SUCCEEDED, res.root_cause
    assert (tmp_path / "ran0").exists() and (tmp_path / "ran1").exists()
    wire = bytes(relay.seen[Relay.TO_NODE]) + bytes(relay.seen[Relay.TO_SUPERVISOR])
    for plain in (b"TFCLUSTER_TASK_INDEX", b"remote_dir", b"TF_CONFIG", b"hello", b"heartbeat", b'"go"'):
        assert plain not in wire  # the config, commands and messages crossed the relay only sealed


def test_the_secret_is_in_no_process_environment(tmp_path):
    """worker_entry reads the secret on stdin: neither its /proc/PID/environ nor the task's holds it."""
    code = (
        "import os, pathlib; d = pathlib.Path(os.environ['OUT']); i = os.environ['TFCLUSTER_TASK_INDEX']; "
        "(d / f'parent{i}').write_bytes(open(f'/proc/{os.getppid()}/environ', 'rb').read()); "
        "(d / f'self{i}').write_bytes(open('/proc/self/environ', 'rb').read())"
    )
    loaded, plan = real_plan(2, command=[sys.executable, "-c", code], env={"OUT": str(tmp_path)})
    backend = LocalNodes()
    rec = Recorder()
    sup = Supervisor(
        loaded.spec, plan, backend, attempt=0, bus=EventBus([rec]), logs=rec, heartbeats=rec, interrupt=Interrupt()
    )
    try:
        res = sup.run()
    finally:
        backend.close()
    assert res.state == JobState.SUCCEEDED, res.root_cause
    for i in range(2):
        for name in (f"parent{i}", f"self{i}"):
            environ = (tmp_path / name).read_bytes()
            assert b"TFCLUSTER_CONNECT" in environ or name.startswith("self")
            assert backend.secret.hex().encode() not in environ and b"TFCLUSTER_SECRET" not in environ
