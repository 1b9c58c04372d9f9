"""The commands: each loads what it needs (lazily, so `tfcluster --help` stays fast) and returns an exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.diagnostics import Diagnostic
from ..core.errors import SpecError, UsageError
from ..core.terminal import safe_text
from .exitcodes import EXIT_CONNECT, EXIT_OK, EXIT_USAGE, exit_code_for

if TYPE_CHECKING:
    from ..supervise.bound import RunBound


def version() -> str:
    from .. import __version__

    return __version__


def cmd_validate(args: argparse.Namespace) -> int:
    """`tfcluster validate SPEC...`: every problem of every spec at once, as FILE:LINE: field: message."""
    from ..spec import load_spec

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
                print(p.render(), file=sys.stderr)
            if ok:
                print(f"{path}: valid")
            else:
                n = sum(1 for p in problems if p.severity == "error")
                print(f"{path}: invalid ({n} problem{'s' if n != 1 else ''})", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    return EXIT_OK if all(r["valid"] for r in results) else EXIT_USAGE


def _usage_problem(path: str, message: str) -> Diagnostic:
    return Diagnostic.at(path, None, "spec", message.removeprefix(f"{path}: "))


def cmd_plan(args: argparse.Namespace) -> int:
    """`tfcluster plan SPEC`: what launch would run on every node, from the spec's scheduler's planner;
    ``--task``: one task in full; ``--json``: the plan record (what RUN/plan.json holds)."""
    from ..plan.record import PlanRecord
    from ..plan.render import find_task, task_dict
    from ..schedulers import load_plan, scheduler_for

    loaded, plan = load_plan(args.spec, args.run_id)
    for w in loaded.warnings:
        print(str(w), file=sys.stderr)
    scheduler = scheduler_for(loaded.spec)
    if args.task is not None:
        try:
            node = find_task(plan, args.task)
        except ValueError as exc:
            raise UsageError(f"--task {args.task[:60]}: {exc}") from None
        if args.json:
            print(json.dumps(task_dict(node, show_secrets=args.show_secrets), indent=2))
        else:
            print(scheduler.describe_task(plan, node, show_secrets=args.show_secrets))
    elif args.json:
        sys.stdout.write(PlanRecord.from_plan(plan, show_secrets=args.show_secrets).to_json())
    else:
        print(scheduler.describe(plan, show_secrets=args.show_secrets, every_task=args.all))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    """`tfcluster schema`: the JSON Schema of a cluster spec (for editors)."""
    from ..spec.sections import spec_schema

    print(json.dumps(spec_schema(), indent=2))
    return EXIT_OK


def cmd_launch(args: argparse.Namespace) -> int:
    """`tfcluster launch SPEC`: validate, plan, and hand the launch to the spec's scheduler — here, in the
    background (``--detach``), or to the scheduler itself (a Slurm login node). Owns no run: the
    scheduler's job does; the exit code comes from the run's result."""
    from ..job import LaunchOptions
    from ..schedulers import load_plan, scheduler_for

    command = list(args.cmd) or None
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port {args.metrics_port}: must be a TCP port (0: any free port)")
    bound = run_bound(args.max_steps, args.max_duration)
    run_id = args.detached_run_id or _run_id_from_dir(args.run_dir)
    loaded, plan = load_plan(args.spec, run_id, command)
    scheduler = scheduler_for(loaded.spec)
    if args.check:  # the check first (cli/check.py): refuses (exit 6), or leaves named hosts out
        from .check import check_before_launch

        checked, findings = check_before_launch(args, loaded, scheduler)
        if checked is not loaded:
            loaded, plan = checked, scheduler.plan(checked, plan.run_id)
    else:
        findings = ()
    opts = LaunchOptions(
        run_dir=args.run_dir,
        preflight=not args.no_preflight,
        gather=not args.no_gather,
        live=not args.no_live and not args.detached_child,
        echo_logs=not args.quiet,
        all_output=args.all_output,
        adopt_run_dir=args.detached_child,
        metrics_port=args.metrics_port,
        bound=bound if bound.active else None,
        detach=args.detach,
        command=tuple(command) if command else None,
        tensorboard_dir=_tensorboard_dir(args.tensorboard),
        check_findings=findings,
    )
    scheduler.check(opts)
    if args.detach and scheduler.supervises_here():
        from ..job.detach import launch_detached

        switches = (
            ("--no-preflight", args.no_preflight),
            ("--no-gather", args.no_gather),
            ("--all-output", args.all_output),
        )
        flags = [f for f, on in switches if on]
        if args.metrics_port is not None:
            flags += ["--metrics-port", str(args.metrics_port)]
        flags += ["--max-steps", str(args.max_steps)] if args.max_steps is not None else []
        flags += ["--max-duration", args.max_duration] if args.max_duration is not None else []
        flags += ["--tensorboard", opts.tensorboard_dir] if opts.tensorboard_dir is not None else []
        code, message = launch_detached(
            args.spec,
            args.run_dir or os.path.join("runs", plan.run_id),
            plan.run_id,
            [*flags, *(["--", *command] if command else [])],
        )
        print(message, file=sys.stdout if code == 0 else sys.stderr)
        return code
    result = scheduler.launch(loaded, plan, opts)
    if result is not None:
        after_run(result.run_dir)
    return EXIT_OK if result is None else exit_code_for(result)


def _tensorboard_dir(value: str | None) -> str | None:
    """--tensorboard DIR, absolute (a detached launcher runs elsewhere), checked for control characters."""
    if value is None:
        return None
    if not value.strip() or any(c < " " or c == "\x7f" for c in value):
        raise UsageError(f"--tensorboard {value!r}: must be a directory path without control characters")
    return os.path.abspath(os.path.expanduser(value))


def after_run(run_dir: str | os.PathLike[str]) -> None:
    """What follows a recorded run: its end (goodput, whole-run rates) into its TensorBoard directory, and
    its summary (RUN/summary.json: the whole-run report ``report`` then reads without the records).
    A problem here is a warning: the run's outcome and exit code are already settled."""
    from ..runs import RunDir
    from ..views.records import heartbeat_records
    from ..views.runsummary import summarise
    from ..views.tensorboard import write_end

    run = RunDir(Path(run_dir))
    try:
        records: list[dict[str, Any]] | None = heartbeat_records(run.heartbeats_jsonl)  # once for both (81 MB at 4,096)
    except Exception:  # each reads them itself, and says what failed
        records = None
    try:
        write_end(run, records)
    except Exception as exc:
        print(f"tfcluster: warning: the run's goodput was not written to TensorBoard: {exc!r}", file=sys.stderr)
    try:  # `report` reads it instead of every record (views.runsummary): at 4,096 tasks ~9 s of CPU once, here
        summarise(run, records)
    except Exception as exc:
        print(
            f"tfcluster: warning: the run's summary.json was not written (report reads the records): {exc!r}",
            file=sys.stderr,
        )


def run_bound(
    max_steps: int | None, max_duration: str | None, names: tuple[str, str] = ("--max-steps", "--max-duration")
) -> RunBound:
    """--max-steps/--max-duration (or scale's --steps/--duration: ``names``) as a RunBound (inactive
    when neither is given)."""
    from ..supervise.bound import RunBound
    from ..views.logs import parse_duration

    if max_steps is not None and max_steps < 1:
        raise UsageError(f"{names[0]} {max_steps}: must be at least 1")
    seconds = parse_duration(max_duration, names[1]) if max_duration is not None else None
    if seconds is not None and seconds <= 0:
        raise UsageError(f"{names[1]} {max_duration}: must be longer than 0 s")
    return RunBound(steps=max_steps, seconds=seconds)


def _run_id_from_dir(run_dir: str | None) -> str | None:
    """The run id a --run-dir implies (its last component, made unique), after checking the path."""
    if run_dir is None:
        return None
    from ..plan import run_id_for_dir

    bad = next((c for c in run_dir if c < " " or c == "\x7f"), None)
    if not run_dir.strip() or bad is not None:
        raise UsageError(f"--run-dir {run_dir!r}: must be a path without control characters")
    from pathlib import Path

    from ..runs import check_new_dir

    check_new_dir(Path(run_dir))
    return run_id_for_dir(run_dir)


def _run_and_handle(args: argparse.Namespace, wait: bool = False) -> tuple[Any, Any]:
    """The run named on the command line and its handle (its scheduler's view of it)."""
    from ..runs import wait_for_run
    from ..schedulers import scheduler_of

    run = wait_for_run(args.run, args.runs_dir) if wait else resolved_run(args)
    return run, scheduler_of(run).handle(run)


def resolved_run(args: argparse.Namespace) -> Any:
    """The run named on the command line (this user's own runs first); whose it is, said on stderr when
    it is another user's (a shared runs directory: anyone may plant a run of any name there)."""
    from ..runs import resolve_run
    from ..runs.rundir import foreign_owner

    run = resolve_run(args.run, args.runs_dir)
    owner = foreign_owner(run)
    if owner is not None:
        print(f"tfcluster: note: {run.path} is a run of {owner}, not one of yours", file=sys.stderr)
    return run


def cmd_logs(args: argparse.Namespace) -> int:
    """`tfcluster logs RUN`: the run's combined lines, filtered; --follow until the run ends or its
    supervisor is gone (its scheduler's handle says which)."""
    from ..views.logs import LogQuery, show_logs

    run, handle = _run_and_handle(args, wait=args.follow)
    query = LogQuery.from_args(
        tasks=args.task,
        grep=args.grep,
        since=args.since,
        raw=args.raw,
        timestamps=args.timestamps,
        hide_tf_noise=args.hide_tf_noise,
    )
    show_logs(run, query, follow=args.follow, out=sys.stdout, alive=handle.alive)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """`tfcluster status RUN`: the run's state and every task's figures, with its scheduler's view;
    without RUN, the recent runs (``views.runs``)."""
    from ..views.control import job_status, json_safe, status_text

    if args.run is None:
        return _list_runs(args)
    if args.state is not None or args.limit is not None:
        raise UsageError("--state and --limit filter the list of runs: use them without RUN")
    run, handle = _run_and_handle(args)
    status = job_status(run, handle)
    # the root cause quotes a task's last lines, the pods' reasons are the cluster's: safe for a terminal
    print(
        json.dumps(json_safe(status), indent=2)
        if args.json
        else safe_text(status_text(status, handle, show_all=args.all))
    )
    return EXIT_OK


def _list_runs(args: argparse.Namespace) -> int:
    """`tfcluster status` without RUN: the runs under --runs-dir, newest first, each live one's state
    from its scheduler's handle."""
    from ..schedulers import scheduler_of
    from ..views.runs import DEFAULT_LIMIT, list_runs, runs_text

    states = {s.strip() for s in args.state.split(",") if s.strip()} if args.state is not None else None
    if states is not None and not states:
        raise UsageError("--state: name at least one state (running, failed, succeeded, ...)")
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit {args.limit}: must be 0 (all) or more")
    limit = DEFAULT_LIMIT if args.limit is None else (args.limit or None)
    listing = list_runs(args.runs_dir, lambda run: scheduler_of(run).handle(run), states=states, limit=limit)
    print(json.dumps(listing.to_dict(), indent=2) if args.json else safe_text(runs_text(listing)))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """`tfcluster stop RUN`: the run's own clean teardown, through its scheduler's handle."""
    from ..views.control import stop_job

    run, handle = _run_and_handle(args)
    print(safe_text(stop_job(run, handle, timeout_s=args.timeout)))
    return EXIT_OK


def cmd_gather(args: argparse.Namespace) -> int:
    """`tfcluster gather RUN`: finish or redo a run's gather (where its scheduler can reach the nodes)."""
    from ..schedulers import scheduler_of

    run = resolved_run(args)
    scheduler_of(run).gather(run)
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    """`tfcluster preflight SPEC`: every check on every host before a launch (where the scheduler allows)."""
    from ..schedulers import load_plan, scheduler_for

    loaded, plan = load_plan(args.spec)
    report = scheduler_for(loaded.spec).preflight(loaded, plan)
    print(json.dumps(report.to_dict(), indent=2) if args.json else safe_text(report.text()))
    return EXIT_OK if report.ok else EXIT_CONNECT


def scheduler_command(command: Any) -> Callable[[argparse.Namespace], int]:
    """A scheduler's own command (``schedulers.command``) as a CLI command: what it returns, as an exit
    code (a run it supervised: the run's own; its end recorded once the run is over)."""

    def run(args: argparse.Namespace) -> int:
        from ..core.result import RunResult
        from ..runs import RunDir

        result = command.run(args)
        if not isinstance(result, RunResult):
            return EXIT_OK
        if RunDir(Path(result.run_dir)).is_finished():  # not a run going on in the scheduler's next allocation
            after_run(result.run_dir)
        return exit_code_for(result)

    return run


def cmd_demo(args: argparse.Namespace) -> int:
    """`tfcluster demo`: a throwaway test bed and a real 3-worker MWMS training on it."""
    from .demo import run_demo

    return run_demo(hosts=args.hosts, mode=args.mode, epochs=args.epochs, run_dir=args.run_dir)
