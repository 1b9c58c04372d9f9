"""``python -m worker_entry kubernetes -- COMMAND...``: worker_entry as a Kubernetes pod's main process.

The pod was rendered by ``tfcluster render`` (or applied by ``tfcluster launch``): ``TFCLUSTER_POD``
holds the cluster (the stable DNS names of every pod) and how to run, the Job controller sets
``JOB_COMPLETION_INDEX``, the downward API gives ``TFCLUSTER_ATTEMPT`` (the JobSet's restart attempt,
or the launcher's). From these worker_entry makes its task's ``NodeConfig`` (and from its cluster, as
everywhere, the TF_CONFIG) and runs the command exactly
as over SSH (``runner.Runner``: own process group, PR_SET_PDEATHSIG, TERM → grace → KILL on the
kubelet's SIGTERM, heartbeats) — with no launcher to wait for: it starts at once, and its stream is
written to the pod log as lines (``protocol.podlog``) that the launcher parses when it follows the
log, and that ``kubectl logs`` shows as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
from collections.abc import Mapping

from ... import protocol as p
from ...protocol.cluster import cluster_endpoint
from ...protocol.podlog import POD_CONFIG_VERSION, PodConfig, encode_message, encode_output
from ...protocol.roles import CLUSTER_ROLES

USAGE = "usage: python -m worker_entry kubernetes -- COMMAND [ARG...]"


def _index(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{name} is not set (the pod must belong to an Indexed Job)")
        return default
    if not raw.isdigit():
        raise ValueError(f"{name}={raw[:40]!r} is not a non-negative integer")
    return int(raw)


def pod_node_config(command: list[str], env: Mapping[str, str]) -> p.NodeConfig:
    """The task's NodeConfig: its type's, as the launcher built it (``PodConfig.config``), made this
    pod's own (index, attempt, directory, command); ValueError says what is missing or wrong."""
    if not command:
        raise ValueError(f"no command to run ({USAGE})")
    raw = env.get(p.Env.POD)
    if not raw:
        raise ValueError(f"{p.Env.POD} is not set: this pod was not rendered by tfcluster")
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        if obj.get("v", 1) != POD_CONFIG_VERSION:
            raise ValueError(
                f"version {str(obj.get('v', 1))[:10]}, but this worker_entry reads version {POD_CONFIG_VERSION}: "
                "render the manifests again with the tfcluster of this image"
            )
        pod = PodConfig.from_dict(obj)
    except (ValueError, RecursionError) as exc:  # ProtocolError is a ValueError
        raise ValueError(f"{p.Env.POD}: {exc}") from None
    base = pod.config
    kind = base.task.type
    index = _index(env, p.Env.JOB_COMPLETION_INDEX)
    # an evaluator is outside the cluster (as TF's docs do): its count comes on its own
    count = len(base.cluster.get(kind) or []) if kind in CLUSTER_ROLES else pod.tasks or 0
    if index >= count:
        where = "cluster" if kind in CLUSTER_ROLES else "job"
        raise ValueError(f"{p.Env.JOB_COMPLETION_INDEX}={index} but the {where} has {count} {kind} task(s)")
    task = p.TaskRef(kind, index)
    attempt = _index(env, p.Env.ATTEMPT, default=0)
    return dataclasses.replace(
        base,
        argv=list(command),
        remote_dir=f"{pod.remote_dir.rstrip('/')}/{kind}-{index}",
        task=task,
        attempt=min(attempt, 1000),
        # what differs per pod of one template (the rest of the environment is the container's)
        env={
            p.Env.TASK_INDEX: str(index),
            p.Env.IS_CHIEF: "1" if p.is_chief(kind, index, "chief" in base.cluster) else "0",
            p.Env.ATTEMPT: str(attempt),
        },
        wait_for_go=False,  # nobody sends one: MWMS itself waits for every peer
    )


def hostname_warning(config: p.NodeConfig) -> str | None:
    """The pod's hostname should be the first label of its own cluster entry; peers dial that name."""
    endpoint = cluster_endpoint(config.cluster, config.task)
    if endpoint is None:
        return None  # an evaluator: nobody dials it
    expected = endpoint.rsplit(":", 1)[0].split(".", 1)[0]
    actual = socket.gethostname().split(".", 1)[0]
    if actual == expected:
        return None
    return (
        f"worker_entry: this pod's hostname is {actual!r} but TF_CONFIG names it {expected!r}; its peers "
        "will not reach it unless that name resolves here (was the manifest edited?)\n"
    )


class PodLog(threading.Thread):
    """Turns the runner's frames (read from a pipe) into pod-log lines on ``out_fd``, in order."""

    def __init__(self, read_fd: int, out_fd: int) -> None:
        super().__init__(name="pod-log", daemon=True)
        self.read_fd = read_fd
        self.out_fd = out_fd

    def run(self) -> None:
        decoder = p.FrameDecoder()
        while True:
            try:
                data = os.read(self.read_fd, 1 << 20)
            except OSError:
                data = b""
            if not data:
                break
            try:
                frames = decoder.feed(data)
            except p.ProtocolError:  # our own frames: cannot happen; never lose the rest silently
                frames = []
            for fr in frames:
                if fr.type == p.T_LOG:
                    if fr.payload.endswith(b"\r"):  # a progress frame: a pod log has no "in place"
                        continue
                    self._write(encode_output(fr.payload))
                elif fr.type == p.T_MSG:
                    self._write(encode_message(fr.payload))
        os.close(self.read_fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except InterruptedError:
                continue
            except OSError:
                return  # stdout is gone: the container is going away; the runner still ends the task
            view = view[n:]


def serve_pod(config: p.NodeConfig, out_fd: int = 1) -> int:
    """Run the task; frames go through a pipe to ``PodLog``, which writes the pod log."""
    from ..runner import Runner

    warning = hostname_warning(config)
    if warning:
        with contextlib.suppress(OSError):
            os.write(out_fd, encode_output(warning.encode()))
    real_out = os.dup(out_fd)
    os.dup2(2, out_fd)  # stray prints of ours go to stderr, never between two lines of the stream
    sys.stdout = sys.stderr
    r, w = os.pipe()
    log = PodLog(r, real_out)
    log.start()
    try:
        code = Runner(config, w, None).main()
    finally:
        os.close(w)
        log.join(30)
    return code


def main(argv: list[str], env: Mapping[str, str] = os.environ) -> int:
    command = argv[1:] if argv[:1] == ["--"] else list(argv)
    try:
        config = pod_node_config(command, env)
    except ValueError as exc:
        print(f"worker_entry kubernetes: {exc}", file=sys.stderr)
        return 2
    os.environ.pop(p.Env.POD, None)  # the training command gets its TF_CONFIG (from the config's cluster)
    for name in [n for n in os.environ if n.startswith(p.Env.SECRET_ARG + "_")]:
        os.environ.pop(name)  # the kubelet already put these credentials into the command's words
    return serve_pod(config)


def run(argv: list[str]) -> int:
    """``python -m worker_entry kubernetes ...`` (``agent.main`` finds this mode by its name)."""
    return main(argv)
