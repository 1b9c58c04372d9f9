"""A real ``Job`` whose nodes are the load generator's (``tfcluster_testbed.loadgen``): thousands of tasks.

``LoadGenBackend`` is a ``ConnectBackBackend`` whose "scheduler" starts one generator process playing
every rank of the attempt; the supervisor, its pump, sessions, sinks and the job are the product's.
Used by the scale tests and, as a script, by ``bench/supervisor_scale.py`` (the launcher process it
measures)::

    python tests/loadfleet.py --tasks 1024 --run-dir RUN [--interval 1] [--cues FIFO] [--gen-events FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator.backends.tcp import ConnectBackBackend  # noqa: E402
from orchestrator.job import Job  # noqa: E402
from orchestrator.job.options import LaunchOptions  # noqa: E402
from orchestrator.schedulers.ssh import ssh_plan  # noqa: E402
from orchestrator.spec import load_spec_text  # noqa: E402
from tfcluster_testbed.loadgen import LoadGenerator  # noqa: E402


class LoadGenBackend(ConnectBackBackend):
    """Every task of an attempt is a rank of one load-generator process that dials back."""

    name = "loadgen"

    def __init__(
        self, *, threads: int = 2, log_rate: float = 0.0, cues: str | None = None, events: str | None = None
    ) -> None:
        super().__init__(bind=("127.0.0.1", 0))
        self.options: dict[str, Any] = {"threads": threads, "log_rate": log_rate, "cues": cues, "events": events}
        self.generators: list[LoadGenerator] = []

    @property
    def gen(self) -> LoadGenerator:
        return self.generators[-1]

    def launch(self, starts: Sequence[Any]) -> None:
        for g in self.generators:  # the previous attempt's nodes are gone
            g.stop()
        attempt = starts[0][1].attempt if starts else 0  # a restart's nodes prove they were started for it
        self.generators.append(
            LoadGenerator(self.server.address, self.secret, range(len(starts)), attempt=attempt, **self.options)
        )

    def close(self) -> None:
        super().close()
        for g in self.generators:
            g.stop()


def load_plan(n: int, *, interval: float = 1.0, timeout: float = 10.0, profile_s: float = 0.0, **sections: Any):
    """A (LoadedSpec, Plan) of ``n`` made-up hosts (the nodes are the generator's)."""
    import yaml

    doc: dict[str, Any] = {
        "version": 1,
        "name": f"load{n}",
        "hosts": [{"address": f"node{i}"} for i in range(n)],
        "job": {"command": ["train"], "startup_timeout_s": 120, "failure_grace_s": 1, "stop_grace_s": 2},
        "heartbeat": {
            "interval_s": interval,
            "timeout_s": timeout,
            "progress_timeout_s": None,
            "profile_interval_s": profile_s,
        },
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's: the harness's 4,096 hosts in ~0.1 s, not ~1 s
    loaded = load_spec_text(yaml.dump(doc, Dumper=dumper), "load.yaml")
    return loaded, ssh_plan(loaded.spec, run_id=f"load{n}", local_user="me", ssh_lookup=None)


def run_job(n: int, run_dir: Path, backend: LoadGenBackend, *, gather: bool = True, **plan: Any):
    loaded, the_plan = load_plan(n, **plan)
    opts = LaunchOptions(run_dir=str(run_dir), gather=gather, live=False, echo_logs=False)
    return Job(loaded, the_plan, opts, backend).run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one launcher, N load-generator tasks")
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--profile-s", type=float, default=0.0)
    ap.add_argument("--log-rate", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cues")
    ap.add_argument("--gen-events")
    ap.add_argument("--metrics", action="store_true", help="serve /metrics on a free loopback port")
    args = ap.parse_args(argv)
    extra = {"metrics": {"port": 0}} if args.metrics else {}
    backend = LoadGenBackend(threads=args.threads, log_rate=args.log_rate, cues=args.cues, events=args.gen_events)
    result = run_job(
        args.tasks,
        Path(args.run_dir),
        backend,
        interval=args.interval,
        timeout=args.timeout,
        profile_s=args.profile_s,
        **extra,
    )
    print(
        json.dumps(
            {"state": result.state.value, "root_cause": result.root_cause.to_dict() if result.root_cause else None}
        )
    )
    return 0 if result.state.value == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
