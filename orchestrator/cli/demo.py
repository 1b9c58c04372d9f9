"""`tfcluster demo`: a throwaway 3-host SSH test bed on this machine and a real MWMS job on it.

Everything real: one sshd per host with generated keys and strict host-key checking, the launcher
over paramiko, 3 TensorFlow workers training a small Keras model over gRPC. The test bed is torn
down afterwards; the run directory stays.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..core.errors import UsageError


def run_demo(*, hosts: int = 3, mode: str = "auto", epochs: int = 3, run_dir: str | None = None) -> int:
    try:
        from tfcluster_testbed import Testbed, TestbedError
    except ImportError:
        raise UsageError("the demo needs tfcluster's test bed: pip install 'tfcluster[testbed]'") from None

    if hosts < 1 or hosts > 16:
        raise UsageError("--hosts must be between 1 and 16")
    if not os.path.exists("/usr/sbin/sshd") and not shutil.which("sshd"):
        raise UsageError("the demo needs OpenSSH's sshd: install it (apt-get install -y openssh-server) and retry")
    work = Path(tempfile.mkdtemp(prefix="tfcluster-demo-"))
    try:
        try:
            tb = Testbed(hosts, mode=mode).start()
        except TestbedError as exc:
            raise UsageError(f"cannot build the demo test bed: {exc}") from None
        try:
            command = [
                sys.executable,
                "-m",
                "worker_entry.examples.keras_synthetic",
                "--epochs",
                str(epochs),
                "--steps-per-epoch",
                "100",
            ]
            spec = tb.write_spec(
                work / "demo.yaml",
                "demo",
                command,
                heartbeat={"profile_interval_s": 1},  # a short job: 1 s step-clock windows for `report`
                job={"env": {"TF_CPP_MIN_LOG_LEVEL": "1"}},  # TensorFlow's INFO chatter hides the training
            )
            where = ", ".join(f"{h.address}:{h.ssh_port}" for h in tb.hosts)
            print(
                f"tfcluster demo: {tb.mode} test bed with {hosts} sshd host(s) ({where}); "
                f"spec {spec}; launching {hosts} TensorFlow workers...",
                file=sys.stderr,
                flush=True,
            )
            argv = [sys.executable, "-m", "orchestrator", "launch", str(spec)]
            if run_dir:
                argv += ["--run-dir", run_dir]
            else:
                from ..plan import default_run_id

                run_dir = os.path.join("runs", default_run_id("demo"))
                argv += ["--run-dir", run_dir]
            proc = subprocess.Popen(tb.launcher_argv(argv))
            # Ctrl-C reaches the launcher too (same terminal); we just wait for its clean teardown.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                code = proc.wait()
            finally:
                signal.signal(signal.SIGINT, previous)
            print(
                f"\ntfcluster demo: run directory {run_dir}\n"
                f"  tfcluster logs {run_dir} --task worker:0\n"
                f"  tfcluster status {run_dir}\n"
                f"  tfcluster report {run_dir}",
                file=sys.stderr,
            )
            return code
        finally:
            tb.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
