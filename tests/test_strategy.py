"""Communication options, coordination heartbeat and make_strategy, checked on TensorFlow's own objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from waiting import wait_for

from worker_entry.instrument import progress, strategy

tf = pytest.importorskip("tensorflow")
ROOT = Path(__file__).resolve().parents[1]
Impl = tf.distribute.experimental.CommunicationImplementation


@pytest.mark.parametrize(
    ("value", "expected"),
    [("nccl", Impl.NCCL), ("ring", Impl.RING), ("RING", Impl.RING), ("auto", Impl.AUTO), (None, Impl.AUTO)],
)
def test_communication_options_implementation(value, expected):
    env = {} if value is None else {"TFCLUSTER_COMMUNICATION": value}
    options = strategy.communication_options(env)
    # tf.distribute.experimental.CommunicationOptions(...) builds a collective_util.Options.
    from tensorflow.python.distribute import collective_util

    assert isinstance(options, collective_util.Options)
    assert options.implementation == expected
    assert options.timeout_seconds is None


def test_communication_options_timeout():
    options = strategy.communication_options({"TFCLUSTER_COLLECTIVE_TIMEOUT_S": "2.5"})
    assert options.timeout_seconds == 2.5 and options.implementation == Impl.AUTO
    assert strategy.env_configures_communication({"TFCLUSTER_COLLECTIVE_TIMEOUT_S": "2.5"})
    assert not strategy.env_configures_communication({"TFCLUSTER_COMMUNICATION": "auto"})


@pytest.mark.parametrize(
    "env",
    [
        {"TFCLUSTER_COMMUNICATION": "mpi"},
        {"TFCLUSTER_COLLECTIVE_TIMEOUT_S": "soon"},
        {"TFCLUSTER_COLLECTIVE_TIMEOUT_S": "0"},
    ],
)
def test_bad_values_are_errors(env):
    with pytest.raises(ValueError):
        strategy.communication_options(env)


def test_heartbeat_is_a_noop_without_multi_worker_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy.configure_coordination_heartbeat({}) is False
    assert strategy.configure_coordination_heartbeat({"TFCLUSTER_HEARTBEAT_TIMEOUT_S": "3"}) is False


@pytest.fixture
def progress_pipe(monkeypatch):
    r, w = os.pipe()
    monkeypatch.setenv(progress.ENV_FD, str(w))
    monkeypatch.setattr(progress, "_writer", None)
    yield r
    os.close(r)
    os.close(w)


def _records(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        data = b""
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize(("comm", "impl"), [("ring", Impl.RING), ("nccl", Impl.NCCL), (None, Impl.AUTO)])
def test_make_strategy_single_process_carries_options(monkeypatch, progress_pipe, comm, impl):
    """No TF_CONFIG: a local MWMS; NCCL on a CPU-only machine only warns."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if comm:
        monkeypatch.setenv("TFCLUSTER_COMMUNICATION", comm)
    else:
        monkeypatch.delenv("TFCLUSTER_COMMUNICATION", raising=False)
    monkeypatch.setenv("TFCLUSTER_COLLECTIVE_TIMEOUT_S", "7")
    s = strategy.make_strategy()
    assert isinstance(s, tf.distribute.MultiWorkerMirroredStrategy)
    options = s.extended._communication_options
    assert options.implementation == impl and options.timeout_seconds == 7.0
    (rec,) = _records(progress_pipe)
    assert rec["kind"] == "strategy" and rec["timeout_s"] == 7.0
    assert rec["communication"] == (comm or "ring")  # AUTO on CPU resolves to RING
    with s.scope():
        v = tf.Variable(1.0)
    assert float(s.reduce("SUM", s.run(lambda: v * 2), axis=None)) == 2.0
    assert strategy.report_strategy(s) is False  # one record per strategy


def test_make_strategy_overrides_win(monkeypatch, progress_pipe):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("TFCLUSTER_COMMUNICATION", "nccl")
    mine = tf.distribute.experimental.CommunicationOptions(implementation=Impl.RING, timeout_seconds=99)
    s = strategy.make_strategy(communication_options=mine)
    assert s.extended._communication_options.implementation == Impl.RING
    assert s.extended._communication_options.timeout_seconds == 99
    assert _records(progress_pipe)[0]["communication"] == "ring"


def test_one_worker_tf_config_heartbeat_and_options(tmp_path):
    """A 1-worker TF_CONFIG starts the real multi-worker path (gRPC server, coordination service):
    run it in a child so the test process's TF context stays clean."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = textwrap.dedent(
        """
        import json
        from tensorflow.python.eager import context
        from worker_entry.instrument import strategy
        s = strategy.make_strategy()
        cfg = context.context().coordination_service
        opts = s.extended._communication_options
        print("RESULT", json.dumps({
            "heartbeat_ms": cfg.heartbeat_timeout_in_ms, "service_type": cfg.service_type,
            "leader": cfg.service_leader, "jobs": [(j.name, j.num_tasks) for j in cfg.coordinated_job_list],
            "impl": opts.implementation.name, "timeout": opts.timeout_seconds,
            "workers": s.extended._num_workers,
            "sum": float(s.reduce("SUM", s.run(lambda: 1.0 + 0 * s.num_replicas_in_sync), axis=None)),
        }))
        """
    )
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}}),
        TFCLUSTER_HEARTBEAT_TIMEOUT_S="3",
        TFCLUSTER_COMMUNICATION="ring",
        TFCLUSTER_COLLECTIVE_TIMEOUT_S="5",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(ROOT),
    )
    env.pop("TFCLUSTER_PROGRESS_FD", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-3000:]
    result = json.loads(lines[0][len("RESULT ") :])
    assert result["heartbeat_ms"] == 3000
    assert result["service_type"] == "standalone"
    assert result["leader"] == "/job:worker/replica:0/task:0"
    assert result["jobs"] == [["worker", 1]]
    assert result["impl"] == "RING" and result["timeout"] == 5.0
    assert result["workers"] == 1 and result["sum"] == 1.0


@pytest.mark.e2e
def test_heartbeat_preconfiguration_detects_a_stopped_peer_fast(tmp_path):
    """2 local workers run the unmodified demo under the instrumentation with a 2 s heartbeat; worker:1
    is SIGSTOPped mid-training. TF's default lets worker:0 notice after ~9-10 s; ours after ~2-4 s."""
    import contextlib
    import signal
    import time

    from worker_entry.examples.local_cluster import free_ports, tf_config

    ports = free_ports(2)
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context((tmp_path / f"worker{i}.log").open("w+")) for i in range(2)]
        try:
            for i in range(2):
                env = dict(
                    os.environ,
                    TF_CONFIG=tf_config(ports, i),
                    TF_CPP_MIN_LOG_LEVEL="2",
                    TF_USE_LEGACY_KERAS="1",
                    PYTHONPATH=os.pathsep.join([str(ROOT / "worker_entry" / "_site"), str(ROOT)]),
                    TFCLUSTER_INSTRUMENT="1",
                    TFCLUSTER_HEARTBEAT_TIMEOUT_S="2",
                )
                env.pop("TFCLUSTER_PROGRESS_FD", None)
                argv = [sys.executable, "-m", "worker_entry.examples.keras_synthetic", "--epochs", "200"]
                procs.append(subprocess.Popen(argv, env=env, stdout=logs[i], stderr=subprocess.STDOUT, cwd=ROOT))
            wait_for(
                lambda: "epoch 2/" in (tmp_path / "worker0.log").read_text() or procs[0].poll() is not None,
                90,
                "worker:0's epoch 2",
                interval=0.2,
            )
            assert procs[0].poll() is None, "worker:0 died before training"
            os.kill(procs[1].pid, signal.SIGSTOP)
            stopped = time.monotonic()
            rc = procs[0].wait(timeout=30)
            elapsed = time.monotonic() - stopped
            assert rc != 0  # the survivor fails instead of hanging
            assert elapsed < 6.0, f"worker:0 noticed the stopped peer after {elapsed:.1f} s"
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
