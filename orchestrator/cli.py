"""Command line. The one place that maps errors and results to exit codes.

Exit codes (documented in README):
  0   success
  1   internal error (a bug in tfcluster; rerun with --debug for the traceback)
  2   bad spec or usage
  3   the job failed (a worker failed, was lost or hung, or did not start in time)
  4   connection or preflight failure (nothing ran)
  5   the job succeeded but gathering logs/checkpoints failed verification
  130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (or `tfcluster stop`)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime

from .errors import (
    ConnectError,
    GatherError,
    PreflightError,
    SpecError,
    TfclusterError,
    UsageError,
)

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_JOB_FAILED = 3
EXIT_CONNECT = 4
EXIT_GATHER = 5
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

ERROR_EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (SpecError, EXIT_USAGE),
    (UsageError, EXIT_USAGE),
    (ConnectError, EXIT_CONNECT),
    (PreflightError, EXIT_CONNECT),
    (GatherError, EXIT_GATHER),
    (TfclusterError, EXIT_USAGE),
]

#: RunResult.state -> exit code
STATE_EXIT_CODES = {
    "succeeded": EXIT_OK,
    "failed": EXIT_JOB_FAILED,
    "interrupted_sigint": EXIT_SIGINT,
    "interrupted_sigterm": EXIT_SIGTERM,
    "preflight_failed": EXIT_CONNECT,
    "connect_failed": EXIT_CONNECT,
    "interrupted_sighup": 129,
}


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
        description="Launch, supervise and explain multi-machine TensorFlow MultiWorkerMirroredStrategy jobs over SSH.",
        epilog=textwrap.dedent(
            """\
            typical session:
              tfcluster validate cluster.yaml        # catch mistakes before touching any machine
              tfcluster plan cluster.yaml            # what every node will run (dry run)
              tfcluster preflight cluster.yaml       # ssh, versions, GPUs, ports on every host
              tfcluster launch cluster.yaml          # run it; Ctrl-C tears everything down
              tfcluster logs resnet-4x8 --follow     # from another terminal
            exit codes: 0 ok, 2 bad spec/usage, 3 job failed, 4 connection/preflight failed,
                        5 gather failed, 130/143 interrupted, 1 internal error"""
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"tfcluster {_version()}")
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
    p.set_defaults(func=cmd_validate)

    p = _cmd(
        sub,
        "plan",
        "Dry run: show the TF_CONFIG, environment and remote command of every node. Touches no host.",
        "tfcluster plan cluster_specs/gpu-4x8.yaml\ntfcluster plan cluster.yaml --json | jq '.nodes[0].tf_config'",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--show-secrets", action="store_true", help="do not redact env values named like *KEY*/*TOKEN*")
    p.add_argument("--run-id", help="run id to plan with (default: NAME-<UTC timestamp>, as launch would)")
    p.set_defaults(func=cmd_plan)

    p = _cmd(
        sub,
        "schema",
        "Print the JSON Schema of the cluster spec (for editor completion and checks).",
        "tfcluster schema > cluster.schema.json   # then: # yaml-language-server: $schema=cluster.schema.json",
    )
    p.set_defaults(func=cmd_schema)

    p = _cmd(
        sub,
        "launch",
        "Start the job on every host over SSH, stream logs, supervise, tear down on failure, gather.",
        "tfcluster launch cluster.yaml\ntfcluster launch cluster.yaml --run-dir runs/try1 -- python train.py --epochs 1",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--run-dir", help="run directory (default: ./runs/NAME-<UTC timestamp>)")
    p.add_argument("--no-preflight", action="store_true", help="skip the version/port/GPU checks before starting")
    p.add_argument("--no-gather", action="store_true", help="do not copy logs and checkpoints back after the job")
    p.add_argument("--no-live", action="store_true", help="no live status table, even on a terminal")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print worker output (it is still stored)")
    p.set_defaults(func=cmd_launch, cmd=[])
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
    p.add_argument("--runs-dir", default="runs", help="where job names are looked up (default: ./runs)")
    p.set_defaults(func=cmd_logs)

    p = _cmd(
        sub,
        "status",
        "State of a job and of each task (running, exited, lost), last heartbeat and step.",
        "tfcluster status resnet-4x8\ntfcluster status runs/resnet-4x8-20261122T101500Z --json",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--json", action="store_true")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=cmd_status)

    p = _cmd(
        sub,
        "stop",
        "Ask a running launcher to tear its job down cleanly (like Ctrl-C) and wait until it is done.",
        "tfcluster stop resnet-4x8",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the teardown (default 120)")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=cmd_stop)

    p = _cmd(
        sub,
        "gather",
        "Copy (or finish copying) a run's logs and the chief's checkpoints into RUN/, verified by sha256.",
        "tfcluster gather runs/resnet-4x8-20261122T101500Z",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=cmd_gather)

    p = _cmd(
        sub,
        "preflight",
        "Check every host in parallel: SSH, interpreter and TF versions, GPUs, TF port, workdir, disk, clock.",
        "tfcluster preflight cluster.yaml\ntfcluster preflight cluster.yaml --json",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_preflight)

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
    p.add_argument("--runs-dir", default="runs")
    p.set_defaults(func=cmd_report)

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
    p.set_defaults(func=cmd_demo)
    return parser


# --- commands --------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from .specload import load_spec

    results = []
    for path in args.specs:
        try:
            loaded = load_spec(path)
            problems = list(loaded.warnings)
            ok = True
        except SpecError as exc:
            problems, ok = exc.problems, False
        except UsageError as exc:
            problems = [_usage_problem(path, str(exc))]
            ok = False
        results.append({"file": path, "valid": ok, "problems": [p.to_dict() for p in problems]})
        if not args.json:
            for p in problems:
                print(str(p), file=sys.stderr)
            if ok:
                print(f"{path}: valid")
            else:
                n = sum(1 for p in problems if p.severity == "error")
                print(f"{path}: invalid ({n} problem{'s' if n != 1 else ''})", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    return EXIT_OK if all(r["valid"] for r in results) else EXIT_USAGE


def _usage_problem(path: str, message: str):
    from .errors import Problem

    return Problem(path, None, "spec", message.removeprefix(f"{path}: "))


def load_plan(spec_path: str, run_id: str | None = None, command: list[str] | None = None):
    """Spec file -> (LoadedSpec, Plan); the plan uses ~/.ssh/config like launch does."""
    from .plan import build_plan
    from .specload import load_spec
    from .sshconfig import local_user, ssh_config_lookup

    loaded = load_spec(spec_path)
    spec = loaded.spec
    if command:
        spec = spec.model_copy(update={"job": spec.job.model_copy(update={"command": command})})
        loaded = type(loaded)(spec=spec, path=loaded.path, text=loaded.text, warnings=loaded.warnings)
    plan = build_plan(
        spec,
        run_id=run_id or default_run_id(spec.name),
        local_user=local_user(),
        ssh_lookup=ssh_config_lookup(spec.ssh.config_file),
    )
    return loaded, plan


def default_run_id(name: str) -> str:
    return f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def cmd_plan(args: argparse.Namespace) -> int:
    from .render import plan_text

    loaded, plan = load_plan(args.spec, args.run_id)
    for w in loaded.warnings:
        print(str(w), file=sys.stderr)
    if args.json:
        print(plan.to_json(show_secrets=args.show_secrets))
    else:
        print(plan_text(plan, show_secrets=args.show_secrets))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from .spec import ClusterSpec

    print(json.dumps(ClusterSpec.model_json_schema(), indent=2))
    return EXIT_OK


def cmd_launch(args: argparse.Namespace) -> int:
    from .launch import LaunchOptions, launch

    command = list(args.cmd) or None
    loaded, plan = load_plan(args.spec, _run_id_from_dir(args.run_dir), command)
    result = launch(
        loaded,
        plan,
        LaunchOptions(
            run_dir=args.run_dir,
            preflight=not args.no_preflight,
            gather=not args.no_gather,
            live=not args.no_live,
            echo_logs=not args.quiet,
        ),
    )
    return _exit_for_result(result)


def _run_id_from_dir(run_dir: str | None) -> str | None:
    return os.path.basename(os.path.normpath(run_dir)) if run_dir else None


def _exit_for_result(result) -> int:
    if result.state == "succeeded" and result.gather_error:
        return EXIT_GATHER
    return STATE_EXIT_CODES.get(result.state, EXIT_JOB_FAILED)


def cmd_logs(args: argparse.Namespace) -> int:
    from .logview import LogQuery, show_logs
    from .rundir import resolve_run, wait_for_run

    run = wait_for_run(args.run, args.runs_dir) if args.follow else resolve_run(args.run, args.runs_dir)
    query = LogQuery.from_args(
        tasks=args.task, grep=args.grep, since=args.since, raw=args.raw, timestamps=args.timestamps
    )
    show_logs(run, query, follow=args.follow, out=sys.stdout)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from .control import job_status, status_text
    from .rundir import resolve_run

    status = job_status(resolve_run(args.run, args.runs_dir))
    print(json.dumps(status, indent=2) if args.json else status_text(status))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from .control import stop_job
    from .rundir import resolve_run

    message = stop_job(resolve_run(args.run, args.runs_dir), timeout_s=args.timeout)
    print(message)
    return EXIT_OK


def cmd_gather(args: argparse.Namespace) -> int:
    from .launch import gather_run
    from .rundir import resolve_run

    gather_run(resolve_run(args.run, args.runs_dir))
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    from .preflight import preflight_text, run_preflight

    loaded, plan = load_plan(args.spec)
    report = run_preflight(loaded.spec, plan)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(preflight_text(report))
    return EXIT_OK if report.ok else EXIT_CONNECT


def cmd_report(args: argparse.Namespace) -> int:
    from .logview import parse_duration
    from .report import build_report, report_text
    from .rundir import resolve_run

    last_s = parse_duration(args.last, "--last") if args.last else None
    report = build_report(resolve_run(args.run, args.runs_dir), last_s=last_s)
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(hosts=args.hosts, mode=args.mode, epochs=args.epochs, run_dir=args.run_dir)


# --- entry point -----------------------------------------------------------------------------


def _version() -> str:
    from . import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    has_tail = "--" in argv
    if has_tail:  # everything after the first '--' is the override command of `launch`
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if has_tail:
        if args.command != "launch":
            parser.error("'-- COMMAND' is only accepted by launch")
        if not tail:
            parser.error("'--' must be followed by a command")
        args.cmd = tail
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except SpecError as exc:
        for p in exc.problems:
            print(str(p), file=sys.stderr)
        return EXIT_USAGE
    except TfclusterError as exc:
        print(f"tfcluster: error: {exc}", file=sys.stderr)
        return next(code for cls, code in ERROR_EXIT_CODES if isinstance(exc, cls))
    except KeyboardInterrupt:
        print("tfcluster: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except BrokenPipeError:
        # `tfcluster logs RUN | head`: the reader left; that is not an error.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK
    except Exception as exc:
        if args.debug or os.environ.get("TFCLUSTER_DEBUG"):
            raise
        print(
            f"tfcluster: internal error: {type(exc).__name__}: {exc}\n"
            "  this is a bug in tfcluster; rerun with --debug for the traceback and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
