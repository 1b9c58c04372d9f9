"""Run an MWMS job as N local worker processes on 127.0.0.1 (tests, demos, experiments).

    python -m worker_entry.examples.local_cluster -n 3 [--slow worker:1] -- \
        python -m worker_entry.examples.keras_synthetic --epochs 2 --steps-per-epoch 100

Each task gets its own TF_CONFIG (distinct ports: TensorFlow's gRPC server binds every address), its
own progress pipe (``TFCLUSTER_PROGRESS_FD``) whose records are collected, and its output captured.
Every process is killed by PID when the run ends, however it ends. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: Sequence[int], index: int, host: str = "127.0.0.1") -> str:
    return json.dumps(
        {"cluster": {"worker": [f"{host}:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
    )


@dataclass
class TaskResult:
    index: int
    returncode: int | None
    output: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]


def _drain_text(stream: Any, sink: list[str]) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line)
    stream.close()


def _drain_records(fd: int, sink: list[dict[str, Any]]) -> None:
    with os.fdopen(fd, "rb") as f:
        for line in f:
            try:
                sink.append(json.loads(line))
            except ValueError:
                sink.append({"kind": "<invalid>", "raw": line.decode(errors="replace")})


def run_local_cluster(
    argv: Sequence[str],
    num_workers: int,
    env: Mapping[str, str] | None = None,
    task_env: Callable[[int], Mapping[str, str]] | None = None,
    timeout_s: float = 300.0,
    progress: bool = True,
    cwd: str | None = None,
    fail_fast_s: float | None = 15.0,
) -> list[TaskResult]:
    """Start ``num_workers`` copies of ``argv`` as one MWMS cluster; wait for all (or the timeout).

    ``fail_fast_s``: once a task has failed, the others get this long to exit before they are killed
    (survivors of a dead peer usually fail within seconds, but can hang, e.g. tearing down an input
    pipeline that runs Python code). None waits for the full timeout.
    """
    ports = free_ports(num_workers)
    procs: list[subprocess.Popen] = []
    outputs: list[list[str]] = [[] for _ in range(num_workers)]
    records: list[list[dict[str, Any]]] = [[] for _ in range(num_workers)]
    threads: list[threading.Thread] = []
    try:
        for i in range(num_workers):
            child_env = dict(os.environ if env is None else env)
            child_env["TF_CONFIG"] = tf_config(ports, i)
            child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            if task_env is not None:
                child_env.update(task_env(i))
            pass_fds: tuple[int, ...] = ()
            read_fd = write_fd = None
            if progress:
                read_fd, write_fd = os.pipe()
                child_env["TFCLUSTER_PROGRESS_FD"] = str(write_fd)
                pass_fds = (write_fd,)
            try:
                p = subprocess.Popen(
                    list(argv),
                    env=child_env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    pass_fds=pass_fds,
                )
            finally:
                if write_fd is not None:
                    os.close(write_fd)
            procs.append(p)
            t = threading.Thread(target=_drain_text, args=(p.stdout, outputs[i]), daemon=True)
            t.start()
            threads.append(t)
            if read_fd is not None:
                t = threading.Thread(target=_drain_records, args=(read_fd, records[i]), daemon=True)
                t.start()
                threads.append(t)
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
            if failed_at is not None and fail_fast_s is not None and time.monotonic() - failed_at > fail_fast_s:
                break  # a task failed and the others have not followed: like a launcher, stop them
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, 9)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for t in threads:
            t.join(timeout=5)
    return [TaskResult(i, procs[i].returncode, "".join(outputs[i]), records[i]) for i in range(len(procs))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    results = run_local_cluster(command, args.num_workers, timeout_s=args.timeout)
    for r in results:
        print(f"=== worker:{r.index} exit={r.returncode} records={len(r.records)}")
        print(r.output.rstrip())
        for rec in r.records:
            if rec.get("kind") in ("strategy", "profile"):
                print("   ", json.dumps(rec))
        progress = r.of_kind("progress")
        if progress:
            print("    last progress:", json.dumps(progress[-1]))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
