"""``launch`` from a Slurm login node: submit the batch job, then follow it as if its supervisor ran
here (``follow``) — or, with ``--detach``, leave it to Slurm. Inside an allocation (SLURM_JOB_ID set:
salloc, or the user's own batch script) ``launch`` supervises one srun step per attempt directly
(``batch.launch_in_allocation``)."""

from __future__ import annotations

import sys

from ...core.result import RunResult
from ...core.states import JobState
from ...job import LaunchOptions
from ...plan import Plan
from ...sinks import use_color
from ...sinks.record import print_root_cause
from ...spec import LoadedSpec
from .follow import Follower, ask_cancel_or_detach
from .submit import submit


def submit_and_follow(loaded: LoadedSpec, plan: Plan, opts: LaunchOptions) -> RunResult | None:
    """The run's result as its supervisor recorded it; None when the user detached (the job goes on)."""
    sub = submit(loaded, plan, opts.run_dir, list(opts.command) if opts.command else None, gather=opts.gather)
    note = lambda text: print(f"tfcluster: {text}", file=sys.stderr, flush=True)  # noqa: E731
    if sub.job_id is None:
        result = _result(sub.rundir.read_json(sub.rundir.result_json), JobState.START_FAILED)
        rc = result.root_cause
        note(f"{rc.message if rc else 'sbatch failed'}; run directory {sub.rundir.path}")
        return result
    if opts.detach:  # submitted: the job runs without us; the run directory tells everything
        print(
            f"submitted Slurm job {sub.job_id}; run directory {sub.rundir.path}\n"
            f"  tfcluster logs {sub.rundir.path} --follow\n  tfcluster status {sub.rundir.path}\n"
            f"  tfcluster stop {sub.rundir.path}"
        )
        return None
    note(f"submitted Slurm job {sub.job_id}; run directory {sub.rundir.path} (Ctrl-C: cancel or detach)")
    live = opts.live and opts.echo_logs and use_color(sys.stdout) and sys.stdout.isatty()
    follower = Follower(sub.rundir, plan, live=live, ask=ask_cancel_or_detach, all_output=opts.all_output)
    if not opts.echo_logs:
        follower.query = _Silent()
    data = follower.follow()
    if data is None:
        return None  # detached: the job goes on
    result = _result(data, JobState.FAILED)
    if result.state != JobState.SUCCEEDED and result.root_cause is not None:
        print_root_cause(result.root_cause)
    return result


def _result(data: object, fallback: JobState) -> RunResult:
    """result.json as a RunResult (a damaged one: ``fallback``, so the exit code still says it failed)."""
    try:
        if isinstance(data, dict):
            return RunResult.from_dict(data)
    except (KeyError, TypeError, ValueError):
        pass
    return RunResult("", "", "", fallback, 0.0, 0.0)


class _Silent:
    """--quiet: worker lines are stored, not printed."""

    def parts(self, line: str, color: bool) -> None:
        return None
