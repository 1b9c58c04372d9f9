"""``python -m tfcluster_testbed``: a test bed to play with from a shell.

Starts the hosts, writes a cluster spec for them, prints how to reach them, and tears everything
down on Ctrl-C/SIGTERM/SIGHUP (or cleans up test beds of dead owners with ``--reap``).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .base import TestbedError
from .bed import Testbed
from .state import reap_stale

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tfcluster_testbed",
        description="Start N local sshd 'hosts', write a cluster spec for them, wait for Ctrl-C.",
    )
    ap.add_argument("--hosts", type=int, default=3, help="number of hosts (default 3)")
    ap.add_argument("--mode", choices=["auto", "loopback", "netns"], default="auto")
    ap.add_argument("--single-sshd", action="store_true", help="loopback: one sshd for all addresses")
    ap.add_argument("--spec-out", type=Path, help="where to write the spec (default: in the test bed dir)")
    ap.add_argument("--name", default="testbed", help="job name in the spec (default: testbed)")
    ap.add_argument("--base-dir", help="parent of the test bed directory (default: the temp dir)")
    ap.add_argument("--tf-port", type=int, help="TF port (netns: all hosts; loopback: first host)")
    ap.add_argument("--reap", action="store_true", help="clean up test beds of dead processes and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("command", nargs="*", help="job command for the spec (after --)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Start a test bed, write a spec, wait for Ctrl-C/SIGTERM; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")

    if args.reap:
        for d in reap_stale(args.base_dir):
            print(f"cleaned {d}")
        return 0
    command = args.command or ["python3", "-c", "import socket; print(socket.gethostname())"]
    stop_event = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_event.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    tb = Testbed(args.hosts, mode=args.mode, base_dir=args.base_dir, single_sshd=args.single_sshd, tf_port=args.tf_port)
    try:
        tb.start()
        spec = tb.write_spec(args.spec_out or tb.dir / "cluster.yaml", args.name, command)
        print(f"test bed {tb.id}: {len(tb.hosts)} hosts, {tb.mode} mode, up in {tb.timings['start_s']:.2f}s")
        for h in tb.hosts:
            extra = f" netns {h.netns}" if h.netns else ""
            print(f"  {h.name:8} {h.address}:{h.ssh_port}  tf_port {h.tf_port}  hostname {h.hostname}{extra}")
        if tb.controller_netns:
            print(f"  controller netns {tb.controller_netns} ({tb.controller_address})")
        print(f"spec: {spec}")
        launch = tb.launcher_argv([sys.executable, "-m", "orchestrator", "launch", str(spec)])
        print(f"run the launcher:  {shlex.join(launch)}")
        print(f"ssh to host0:      {shlex.join(tb.launcher_argv(tb.ssh_argv(tb.hosts[0])))}")
        print("Ctrl-C or SIGTERM tears everything down.", flush=True)
        while not stop_event.wait(1.0):
            dead = [s.hosts[0].name for s in tb._all_sshds() if s.popen is not None and s.popen.poll() is not None]
            if dead and not stop_event.is_set():
                log.debug("sshd not running for %s", dead)
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        tb.stop()
        for e in tb.stop_errors:
            print(f"teardown: {e}", file=sys.stderr)
    print(f"torn down in {tb.timings.get('stop_s', 0):.2f}s")
    return 0
