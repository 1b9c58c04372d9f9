"""The one place that maps errors and final job states to exit codes (documented in the README).

0   success
1   internal error (a bug in tfcluster; rerun with --debug for the traceback)
2   bad spec or usage
3   the job failed (a worker failed, was lost or hung, or did not start in time)
4   connection, start or preflight failure (nothing ran)
5   the job succeeded but gathering logs/checkpoints failed verification
6   `tfcluster check` named a slow host, GPU or link (or a host without figures); `launch --check` refused
130 / 143 interrupted by SIGINT (Ctrl-C) / SIGTERM (or `tfcluster stop`); SIGHUP does not stop a job

A Slurm batch step whose allocation ended under it (preempted, time limit) and that handed the run to
the next allocation (state ``requeued``) exits 0: it did its part, the run goes on, and its outcome is
the last allocation's result.json (a non-zero exit would make sacct, ``--mail-type=FAIL`` and an
``afterok`` dependency report a failure for every requeue). Every other live state never ends a
command: meeting one here is a bug, refused with a message saying so.
"""

from __future__ import annotations

from ..core.errors import CheckRefused, ConnectError, GatherError, PreflightError, SpecError, TfclusterError, UsageError
from ..core.result import RunResult
from ..core.states import JobState, interrupted_state

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_JOB_FAILED = 3
EXIT_CONNECT = 4
EXIT_GATHER = 5
EXIT_CHECK_FINDINGS = 6
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

ERROR_EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (SpecError, EXIT_USAGE),
    (UsageError, EXIT_USAGE),
    (ConnectError, EXIT_CONNECT),
    (PreflightError, EXIT_CONNECT),
    (GatherError, EXIT_GATHER),
    (CheckRefused, EXIT_CHECK_FINDINGS),
    (TfclusterError, EXIT_USAGE),
]

#: Job state -> exit code: every outcome, and the one live state a command ends in (a test checks that
#: these and ``REFUSED_STATES`` are every JobState, once).
STATE_EXIT_CODES = {
    JobState.SUCCEEDED: EXIT_OK,
    JobState.FAILED: EXIT_JOB_FAILED,
    JobState.CONNECT_FAILED: EXIT_CONNECT,
    JobState.START_FAILED: EXIT_CONNECT,
    JobState.PREFLIGHT_FAILED: EXIT_CONNECT,
    JobState.INTERRUPTED_SIGINT: EXIT_SIGINT,
    JobState.INTERRUPTED_SIGTERM: EXIT_SIGTERM,
    JobState.REQUEUED: EXIT_OK,  # a Slurm batch step that handed the run to the next allocation
}

#: Live phases no command ends in: ``exit_code_for_state`` refuses them (an internal error, exit 1).
REFUSED_STATES = frozenset(
    {JobState.CONNECTING, JobState.STARTING, JobState.RUNNING, JobState.STOPPING, JobState.RESTARTING}
)


class LiveStateError(RuntimeError):
    """A command ended while its run was still in a live phase: a bug, never an exit code of its own."""


def exit_code_for(result: RunResult) -> int:
    if result.gather_interrupted is not None:  # the job ran its course; the user stopped the gather
        return STATE_EXIT_CODES[interrupted_state(result.gather_interrupted)]
    return exit_code_for_state(result.state.value, bool(result.gather_error))


def exit_code_for_state(state: str, gather_error: bool = False) -> int:
    """The exit code of a final state as result.json spells it (a run followed from a Slurm login node)."""
    try:
        js = JobState(state)
    except ValueError:
        return EXIT_JOB_FAILED
    if js in REFUSED_STATES:
        raise LiveStateError(f"the run ended while still {js.value!r}: it has no outcome to exit with")
    if js == JobState.SUCCEEDED and gather_error:
        return EXIT_GATHER
    return STATE_EXIT_CODES[js]


def exit_code_for_sweep(states: list[str], interrupted: bool) -> int:
    """`tfcluster scale`: the code of the first size that did not succeed (an interrupted sweep: 130
    or 143 as its size's state says, 130 when it stopped between sizes); 0 when every size ran."""
    for state in states:
        code = exit_code_for_state(state)
        if code != EXIT_OK:
            return code
    return EXIT_SIGINT if interrupted or not states else EXIT_OK


def exit_code_for_check(state: str, findings: int) -> int:
    """`tfcluster check`: the check's own run failing (unreachable host, interrupted) wins; then 6 when
    it named anything, else 0. A task that failed without figures is a finding (``no_result``)."""
    code = exit_code_for_state(state)
    if code in (EXIT_CONNECT, EXIT_SIGINT, EXIT_SIGTERM) or (code != EXIT_OK and not findings):
        return code
    return EXIT_CHECK_FINDINGS if findings else EXIT_OK
