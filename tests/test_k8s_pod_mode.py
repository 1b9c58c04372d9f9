"""`python -m worker_entry kubernetes` as a pod's main process, without TensorFlow: the pod log it
writes, the kubelet's SIGTERM, exit codes, and a pod that was not rendered by tfcluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from waiting import wait_for

from orchestrator.schedulers.kubernetes.stream import ContainerEnd, PodStream
from worker_entry import protocol as p
from worker_entry.protocol.podlog import decode_line

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(60)


def pod(tmp_path: Path, *command: str, **env: str) -> subprocess.Popen:
    cfg = {  # a PodConfig (version 2): the task type's NodeConfig, as the launcher renders it
        "v": 2,
        "config": {
            "argv": [],
            "remote_dir": "",
            "job": "j",
            "task": {"type": "worker", "index": 0},
            "cluster": {"worker": ["localhost:1", "x:1"]},
            "heartbeat_interval_s": 0.2,
            "stop_grace_s": 2.0,
        },
        "remote_dir": str(tmp_path),
    }
    full_env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "TFCLUSTER_POD": json.dumps(cfg),
        "JOB_COMPLETION_INDEX": "1",
    }
    full_env.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "worker_entry", "kubernetes", "--", *command],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def messages(log: bytes) -> list[p.Message]:
    out = []
    for line in log.splitlines():
        is_msg, payload = decode_line(line)
        if is_msg:
            out.append(p.parse_message(payload))
    return out


def test_the_pod_log_carries_the_output_as_printed_and_every_message(tmp_path):
    code = 'import sys; print(\'@tfcluster {"type":"exited","code":0}\'); print(\'err\', file=sys.stderr); sys.exit(3)'
    proc = pod(tmp_path, sys.executable, "-c", code)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3  # the container's exit code is the command's
    msgs = messages(out)
    assert [m.TYPE for m in msgs][:2] == ["hello", "spawned"] and msgs[-1].TYPE == "exited"
    assert msgs[0].task == p.TaskRef("worker", 1) and msgs[-1].code == 3
    st = PodStream("p")
    st.feed(out)
    st.command(p.Go())
    st.end(ContainerEnd("p", 3, "Error"))
    frames, _ = st.take()
    logs = b"".join(f.payload for f in p.FrameDecoder().feed(frames) if f.type == p.T_LOG)
    # the user's line comes back as printed, not as a message (stdout and stderr are separate pipes: any order)
    assert sorted(logs.splitlines()) == [b'@tfcluster {"type":"exited","code":0}', b"err"]
    exit_json = json.loads((tmp_path / "worker-1" / "exit.json").read_text())
    assert exit_json["code"] == 3


def test_the_kubelets_sigterm_stops_the_whole_process_group_and_is_reported(tmp_path):
    proc = pod(tmp_path, "sh", "-c", "sleep 300 & sleep 300")
    seen = bytearray()

    def spawned() -> bool:
        seen.extend(os.read(proc.stdout.fileno(), 65536))  # blocks until the agent writes (or ends: b"")
        return b'"type":"spawned"' in seen or proc.poll() is not None

    wait_for(spawned, 20, lambda: f"the agent's spawned message (it wrote {bytes(seen[-300:])!r})", interval=0)
    assert b'"type":"spawned"' in seen, (proc.poll(), bytes(seen[-2000:]))
    # spawned: the shell runs; its two sleeps come a moment later — wait for what is asserted
    children = wait_for(
        lambda: (lambda c: c if len(c) >= 2 else None)(psutil.Process(proc.pid).children(recursive=True)),
        20,
        "the pod's two sleeps",
        interval=0.05,
    )
    assert len(children) >= 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    msgs = messages(seen + out)
    stopping = next(m for m in msgs if m.TYPE == "stopping")
    exited = msgs[-1]
    assert "SIGTERM" in stopping.reason and exited.TYPE == "exited" and exited.stopped
    assert proc.returncode == 128 + signal.SIGTERM
    psutil.wait_procs(children, timeout=5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TFCLUSTER_POD": ""}, "not rendered by tfcluster"),
        ({"JOB_COMPLETION_INDEX": "7"}, "cluster has 2 worker task(s)"),
    ],
)
def test_a_misconfigured_pod_exits_2_saying_why(tmp_path, env, message):
    proc = pod(tmp_path, "true", **env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and message in err.decode()
