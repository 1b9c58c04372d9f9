"""The argument parser: every command with its help, an example and --json where scripts read output."""

from __future__ import annotations

import argparse
import textwrap

from . import analysis as a
from . import check as ck
from . import commands as c


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def _cmd(sub: argparse._SubParsersAction, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=summary,
        description=summary,
        epilog="example:\n" + textwrap.indent(textwrap.dedent(example).strip(), "  "),
        formatter_class=_Formatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfcluster",
        description="Launch, supervise and explain multi-machine TensorFlow MultiWorkerMirroredStrategy jobs over SSH "
        "or under Slurm.",
        epilog=textwrap.dedent(
            """\
            typical session:
              tfcluster validate cluster.yaml        # catch mistakes before touching any machine
              tfcluster plan cluster.yaml            # what every node will run (dry run)
              tfcluster preflight cluster.yaml       # ssh, versions, GPUs, ports on every host
              tfcluster launch cluster.yaml          # run it; Ctrl-C tears everything down
              tfcluster logs resnet-4x8 --follow     # from another terminal
              tfcluster report resnet-4x8 --html     # why it does (not) scale, with pictures
              tfcluster scale cluster.yaml --workers 1,2,4   # measure it at several sizes
            exit codes: 0 ok, 2 bad spec/usage, 3 job failed, 4 connection/preflight failed,
                        5 gather failed, 6 check named a host/link, 130/143 interrupted, 1 internal error"""
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"tfcluster {c.version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _cmd(
        sub,
        "validate",
        "Check cluster spec files; report every problem as FILE:LINE: field: message.",
        "tfcluster validate cluster_specs/*.yaml\ntfcluster validate cluster.yaml --json | jq '.[].problems'",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="cluster spec YAML file(s)")
    p.add_argument("--json", action="store_true", help="print a machine-readable result list on stdout")
    p.set_defaults(func=c.cmd_validate)

    p = _cmd(
        sub,
        "plan",
        "Dry run: the cluster, the command, the environment and where every task runs (summarised past "
        "256 tasks); one task in full with --task. Touches no host.",
        "tfcluster plan cluster_specs/gpu-4x8.yaml\n"
        "tfcluster plan cluster.yaml --all                # every task a row, however many\n"
        "tfcluster plan cluster.yaml --task worker:17     # its whole TF_CONFIG and environment\n"
        "tfcluster plan cluster.yaml --task worker:0 --json | jq .tf_config\n"
        "tfcluster plan cluster.yaml --json | jq '.tasks | length'   # the plan record, as RUN/plan.json",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print the plan record (what RUN/plan.json holds) as JSON")
    p.add_argument("--task", metavar="TASK", help="show one task in full: its TF_CONFIG and whole environment")
    p.add_argument("--all", action="store_true", help="list every task (a large job's table is summarised)")
    p.add_argument("--show-secrets", action="store_true", help="do not redact env values named like *KEY*/*TOKEN*")
    p.add_argument("--run-id", help="run id to plan with (default: NAME-<UTC timestamp>, as launch would)")
    p.set_defaults(func=c.cmd_plan)

    p = _cmd(
        sub,
        "schema",
        "Print the JSON Schema of the cluster spec (for editor completion and checks).",
        "tfcluster schema > cluster.schema.json   # then: # yaml-language-server: $schema=cluster.schema.json",
    )
    p.set_defaults(func=c.cmd_schema)

    p = _cmd(
        sub,
        "launch",
        "Start the job on every host over SSH (or under Slurm: sbatch from a login node, one srun step inside an "
        "allocation), stream logs, supervise, tear down on failure, gather.",
        "tfcluster launch cluster.yaml\ntfcluster launch cluster.yaml --run-dir runs/try1 -- python train.py --epochs 1\n"
        "tfcluster launch cluster.yaml --detach   # then: tfcluster logs NAME -f / status NAME / stop NAME",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--run-dir", help="run directory (default: ./runs/NAME-<UTC timestamp>)")
    p.add_argument("--no-preflight", action="store_true", help="skip the version/port/GPU checks before starting")
    p.add_argument("--no-gather", action="store_true", help="do not copy logs and checkpoints back after the job")
    p.add_argument("--no-live", action="store_true", help="no live status table, even on a terminal")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print worker output (it is still stored)")
    p.add_argument(
        "--all-output",
        action="store_true",
        help="print every worker line as it comes: no collapsing of what several tasks print alike, no hiding of "
        "TensorFlow's known start-up chatter (the logs always keep every line)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="run the launcher in the background (no terminal; output in RUN/launcher.log) and return at once",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics of the running job on PORT (0: any free port; see metrics: in the spec)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="stop the job cleanly once every worker made N training steps (exit 0; the step clock counts them)",
    )
    p.add_argument(
        "--max-duration",
        metavar="DURATION",
        help="stop the job cleanly after DURATION of training (90s, 5m; from the first step), exit 0",
    )
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write tfcluster's TensorBoard scalars under DIR/tfcluster/<run id>/ (your own log dir) instead of "
        "RUN/tensorboard/ (see tensorboard: in the spec)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run `tfcluster check` first (in RUN-check); refuse to start when it names a host or link (exit 6), "
        "or start without them when the spec's check.without_named_hosts allows it",
    )
    p.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--detached-run-id", help=argparse.SUPPRESS)  # the parent's run id: one plan, one id
    p.set_defaults(func=c.cmd_launch, cmd=[], quick_exit=True)
    p.usage = "tfcluster launch [options] SPEC [-- COMMAND...]   (COMMAND overrides job.command)"

    p = _cmd(
        sub,
        "logs",
        "Print a run's aggregated worker logs; --follow keeps printing until the job ends.",
        "tfcluster logs resnet-4x8 --follow\ntfcluster logs runs/resnet-4x8-20261122T101500Z --task worker:1 --grep loss",
    )
    p.add_argument("run", metavar="RUN", help="run directory, or job name (its newest run under ./runs)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines; exit when the job ends")
    p.add_argument("--task", action="append", help="only this task (chief:0, worker:1); repeatable")
    p.add_argument("--grep", metavar="PATTERN", help="only lines matching this regular expression")
    p.add_argument("--since", metavar="DURATION", help="only lines from the last DURATION (30s, 5m, 2h)")
    p.add_argument("--raw", action="store_true", help="without the [task host] prefix")
    p.add_argument("--timestamps", "-t", action="store_true", help="show each line's UTC receive time")
    p.add_argument(
        "--hide-tf-noise",
        action="store_true",
        help="leave out TensorFlow's known start-up chatter (as launch's console does; the log keeps it)",
    )
    p.add_argument("--runs-dir", default="runs", help="where job names are looked up (default: ./runs)")
    p.set_defaults(func=c.cmd_logs)

    p = _cmd(
        sub,
        "status",
        "State of a job and of each task (running, exited, lost), last heartbeat and step; without RUN, the recent "
        "runs under --runs-dir, newest first.",
        "tfcluster status                       # the recent runs: job, state, started, wall time, tasks, root cause\n"
        "tfcluster status --state running,failed --limit 50 --json\n"
        "tfcluster status resnet-4x8\ntfcluster status runs/resnet-4x8-20261122T101500Z --json",
    )
    p.add_argument("run", metavar="RUN", nargs="?", help="run directory or job name (omitted: list the runs)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="every task one a row (a large job shows a summary)")
    p.add_argument("--runs-dir", default="runs", help="where runs are listed and job names looked up (default: ./runs)")
    p.add_argument(
        "--state", metavar="STATE,...", help="list only runs in these states (running, failed, succeeded, ...)"
    )
    p.add_argument("--limit", type=int, metavar="N", help="list at most N runs (default 20; 0: all)")
    p.set_defaults(func=c.cmd_status)

    p = _cmd(
        sub,
        "stop",
        "Ask a running launcher to tear its job down cleanly (like Ctrl-C) and wait until it is done.",
        "tfcluster stop resnet-4x8",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the teardown (default 120)")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=c.cmd_stop)

    p = _cmd(
        sub,
        "gather",
        "Copy (or finish copying) a run's logs and the chief's checkpoints into RUN/, verified by sha256.",
        "tfcluster gather runs/resnet-4x8-20261122T101500Z",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=c.cmd_gather)

    p = _cmd(
        sub,
        "preflight",
        "Check every host in parallel: SSH, interpreter and TF versions, GPUs, TF port, workdir, disk, clock.",
        "tfcluster preflight cluster.yaml\ntfcluster preflight cluster.yaml --json",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=c.cmd_preflight)

    p = _cmd(
        sub,
        "check",
        "Check the cluster before training on it: a matmul benchmark per host (vs the median host), link latency "
        "and bandwidth per host pair, an all-reduce with the job's own MWMS; names slow hosts, GPUs and links.",
        "tfcluster check cluster.yaml\ntfcluster check cluster.yaml --json --timeout 45 -o runs/check1",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print check.json on stdout instead of the tables")
    p.add_argument("--run-dir", "-o", help="run directory (default: ./runs/check-NAME-<UTC timestamp>)")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="end the check within S seconds (default: check.timeout_s)"
    )
    p.add_argument("--verbose", "-v", action="store_true", help="print the nodes' output (it is stored anyway)")
    p.set_defaults(func=ck.cmd_check, quick_exit=True)

    p = _cmd(
        sub,
        "report",
        "Explain a run's scaling: per-worker step time, time split, stragglers, efficiency.",
        "tfcluster report resnet-4x8\ntfcluster report resnet-4x8 --last 60s\n"
        "tfcluster report runs/resnet-4x8-20261122T101500Z --json",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--last",
        metavar="DURATION",
        help="only samples from the run's last DURATION (30s, 5m): the split after a slowdown, not diluted by the whole run",
    )
    p.add_argument("--html", action="store_true", help="also write RUN/report/report.html and its PNGs (matplotlib)")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=a.cmd_report)

    p = _cmd(
        sub,
        "scale",
        "Measure scaling: run the job at several worker counts (its first hosts), each bounded, and report "
        "examples/s, speed-up, efficiency, time split, stragglers and advice (table, scale.json, HTML, PNGs).",
        "tfcluster scale cluster.yaml --workers 1,2,4 --duration 60s\n"
        "tfcluster scale cluster.yaml --workers 1,2,4,8 --steps 300 --strong --run-dir runs/sweep1\n"
        "tfcluster scale cluster.yaml --workers 1,2,4 --examples 2e5 --to-loss 0.35",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--workers", metavar="N,N,...", help="worker counts (default: 1, 2, 4, ... and all hosts)")
    p.add_argument("--steps", type=int, metavar="N", help="train each size for N steps")
    p.add_argument("--duration", metavar="DURATION", help="train each size for DURATION (default 60s; 90s, 5m)")
    p.add_argument(
        "--examples",
        type=_count,
        metavar="E",
        help="train each size on E examples (like 200000 or 2e5): the loss each reached, beside its throughput",
    )
    p.add_argument(
        "--to-loss",
        type=float,
        metavar="L",
        help="also report the steps and the time each size took to reach training loss L (within its bound)",
    )
    p.add_argument(
        "--strong", action="store_true", help="keep the global batch (default: the per-worker batch; weak scaling)"
    )
    p.add_argument("--run-dir", help="sweep directory (default: ./runs/scale-NAME-<UTC timestamp>)")
    p.add_argument("--no-preflight", action="store_true", help="skip the host checks before each size")
    p.add_argument("--verbose", "-v", action="store_true", help="print the workers' output (it is stored anyway)")
    p.add_argument("--json", action="store_true", help="print scale.json on stdout instead of the table")
    _network_args(p, "also predict every size from the smallest one and print the prediction's error beside it")
    p.set_defaults(func=a.cmd_scale, quick_exit=True)

    p = _cmd(
        sub,
        "predict",
        "Predict step time, examples/s, speed-up and efficiency at other worker counts from one measured run "
        "(or a scale sweep) and the network: own work, all-reduce and the wait for stragglers per size.",
        "tfcluster predict runs/scale-resnet-20261122T101500Z --workers 2,4,8,16,64 --check runs/check/check.json\n"
        "tfcluster predict resnet-1x8 --workers 2,4,8,16 --network 25Gbit,5us --html predict.html",
    )
    p.add_argument("run", metavar="RUN", help="a finished run (name or directory) or a `tfcluster scale` directory")
    p.add_argument(
        "--workers", default="2,4,8,16,64", metavar="N,N,...", help="worker counts to predict (default 2,4,8,16,64)"
    )
    _network_args(p, "")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON (sizes shaped like scale.json's)")
    p.add_argument("--html", metavar="OUT.html", help="also write a page with the curve (and OUT.png beside it)")
    p.add_argument("--png", metavar="OUT.png", help="also write the curve as a PNG (matplotlib)")
    p.add_argument(
        "--mtbf", metavar="DURATION", help="mean time between failures (6h, 90m, 2d) for the backup interval"
    )
    p.add_argument("--save-cost", metavar="DURATION", help="one backup's cost (30s); default: measured from the copies")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=_predict)

    p = _cmd(
        sub,
        "demo",
        "Start a 3-host SSH test bed on this machine and run a real 3-worker MWMS training on it.",
        "tfcluster demo\ntfcluster demo --hosts 2 --mode loopback --epochs 2",
    )
    p.add_argument("--hosts", type=int, default=3, help="number of hosts/workers (default 3)")
    p.add_argument(
        "--mode",
        choices=["auto", "loopback", "netns"],
        default="auto",
        help="loopback: 127.0.0.x addresses; netns: network namespaces (root); auto: netns if root",
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--run-dir", help="run directory (default: ./runs/demo-<UTC timestamp>)")
    p.set_defaults(func=c.cmd_demo)

    _scheduler_commands(sub)
    return parser


def _scheduler_commands(sub: argparse._SubParsersAction) -> None:
    """The commands the registered schedulers add (``render``, the hidden ``slurm-batch``, ...)."""
    from ..schedulers import scheduler_commands

    hidden = set()
    for command in scheduler_commands():
        p = _cmd(sub, command.name, command.summary, command.example)
        command.arguments(p)
        p.set_defaults(func=c.scheduler_command(command))
        if command.hidden:
            hidden.add(command.name)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest not in hidden]  # not in --help


def _count(text: str) -> int:
    """A positive count, also written like 2e5."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count like 200000 or 2e5") from None
    if not value >= 1 or value != int(value) or value > 1 << 53:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole count of at least 1")
    return int(value)


def _network_args(p: argparse.ArgumentParser, purpose: str) -> None:
    """--check / --network: the network the scaling model assumes (predict; scale's prediction error)."""
    tail = f" ({purpose})" if purpose else ""
    p.add_argument(
        "--check", metavar="PATH", help=f"check.json of `tfcluster check`: alpha and B of the slowest link{tail}"
    )
    p.add_argument("--network", metavar="RATE,LATENCY", help=f"the network as given, like 25Gbit,5us{tail}")


def _predict(args: argparse.Namespace) -> int:
    from .predict import cmd_predict

    return cmd_predict(args)
