"""`launch` under Slurm, and the hidden `slurm-batch` command that the batch script runs.

From a login node `launch` submits the batch job and follows it (``views.follow``); inside an
allocation (SLURM_JOB_ID set: salloc, or the user's own batch script) it supervises one srun step
directly. Either way the exit code comes from the run's result, through ``exitcodes``.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..core.states import JobState
from .exitcodes import EXIT_OK, EXIT_USAGE, exit_code_for, exit_code_for_state


def launch_slurm(args: argparse.Namespace, loaded, plan) -> int:
    from ..backends.slurm.commands import inside_allocation
    from ..job import LaunchOptions

    opts = LaunchOptions(
        run_dir=args.run_dir,
        preflight=not args.no_preflight,
        gather=not args.no_gather,
        live=not args.no_live and not args.detached_child,
        echo_logs=not args.quiet,
        adopt_run_dir=args.detached_child,
        metrics_port=args.metrics_port,
    )
    if inside_allocation():
        if args.detach:  # like over SSH: the launcher (here: the supervisor of the step) in the background
            return _detach(args, plan)
        from ..job.slurm import launch_in_allocation

        return exit_code_for(launch_in_allocation(loaded, plan, opts))
    return _submit_and_follow(args, loaded, plan, opts)


def _detach(args: argparse.Namespace, plan) -> int:
    from ..job.detach import launch_detached

    flags = [f for f, on in (("--no-preflight", args.no_preflight), ("--no-gather", args.no_gather)) if on]
    if args.metrics_port is not None:
        flags += ["--metrics-port", str(args.metrics_port)]
    command = list(args.cmd)
    code, message = launch_detached(
        args.spec, args.run_dir or os.path.join("runs", plan.run_id), [*flags, *(["--", *command] if command else [])]
    )
    print(message, file=sys.stdout if code == 0 else sys.stderr)
    return code


def _submit_and_follow(args: argparse.Namespace, loaded, plan, opts) -> int:
    from ..job.slurm_submit import submit
    from ..sinks import use_color
    from ..views.follow import Follower, ask_cancel_or_detach

    sub = submit(loaded, plan, opts.run_dir, list(args.cmd) or None, gather=opts.gather)
    note = lambda text: print(f"tfcluster: {text}", file=sys.stderr, flush=True)  # noqa: E731
    if sub.job_id is None:
        result = sub.rundir.read_json(sub.rundir.result_json) or {}
        note(f"{(result.get('root_cause') or {}).get('message', 'sbatch failed')}; run directory {sub.rundir.path}")
        return exit_code_for_state(result.get("state", JobState.START_FAILED.value))
    if args.detach:  # submitted: the job runs without us; the run directory tells everything
        print(
            f"submitted Slurm job {sub.job_id}; run directory {sub.rundir.path}\n"
            f"  tfcluster logs {sub.rundir.path} --follow\n  tfcluster status {sub.rundir.path}\n"
            f"  tfcluster stop {sub.rundir.path}"
        )
        return EXIT_OK
    note(f"submitted Slurm job {sub.job_id}; run directory {sub.rundir.path} (Ctrl-C: cancel or detach)")
    live = opts.live and opts.echo_logs and use_color(sys.stdout) and sys.stdout.isatty()
    follower = Follower(sub.rundir, plan, live=live, ask=ask_cancel_or_detach)
    if not opts.echo_logs:
        follower.query = _Silent()
    result = follower.follow()
    if result is None:
        return EXIT_OK  # detached: the job goes on
    rc = result.get("root_cause") or {}
    if result.get("state") != JobState.SUCCEEDED.value and rc:
        where = f"{rc.get('task')} on {rc.get('host')}" if rc.get("task") else "the job"
        print(f"\nroot cause: {where}: {rc.get('message')}", file=sys.stderr)
        if rc.get("hint"):
            print(f"  fix: {rc['hint']}", file=sys.stderr)
        for line in (rc.get("last_lines") or [])[-10:]:
            print(f"  | {line}", file=sys.stderr)
    return exit_code_for_state(result.get("state", "failed"), bool(result.get("gather_error")))


class _Silent:
    """--quiet: worker lines are stored, not printed."""

    def render(self, line: str, color: bool) -> None:
        return None


def cmd_slurm_batch(args: argparse.Namespace) -> int:
    """The batch script's one command: supervise this allocation's share of the run."""
    from ..job.slurm import run_batch

    if not os.path.isabs(args.run):
        print("tfcluster slurm-batch: RUN must be an absolute path", file=sys.stderr)
        return EXIT_USAGE
    result = run_batch(args.run)
    return EXIT_OK if result is None else exit_code_for(result)
