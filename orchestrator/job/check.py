"""`tfcluster check SPEC` and `launch --check`: an ordinary launch of the check workload on every host.

The spec's command is replaced by ``python -m worker_entry.check`` (the job's own interpreter, its
own TF_CONFIG, ports and communication), with no restarts, no gather and no instrumentation, and
launched through the spec's scheduler like any job: the same backend starts it, the same supervisor
watches it and the same teardown leaves nothing behind on any host. Bounded twice: each node's
watchdog ends its check at the deadline, and the tasks must start within it. When every task has
ended, ``CheckScheduling.settle`` reads each task's ``TFCLUSTER_CHECK`` line from its log, judges
(``checkjudge``), writes ``RUN/check.json`` and emits one ``check_finding`` event per finding.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker_entry.protocol.checkline import find_line
from worker_entry.protocol.env import Env

from ..core.errors import UsageError
from ..events.verdicts import CheckFinding
from ..runs import write_json_atomic
from ..spec import LoadedSpec
from .checkclaims import node_phase, node_result
from .checkjudge import judge
from .scheduling import RunScheduling

if TYPE_CHECKING:
    from .context import RunContext
    from .policy import Decision

#: how much of a task's log the launcher reads for its check line (the line is printed last; a node
#: that printed gigabytes does not make the launcher read them)
LOG_TAIL = 4 << 20
#: what the launch itself needs beyond the nodes' deadline (SSH, worker_entry's start, the teardown)
LAUNCH_MARGIN_S = 15.0


@dataclass
class CheckOutcome:
    """What a check found; ``check`` is check.json's content (None: the check never ran its tasks)."""

    check: dict[str, Any] | None = None


def check_spec(loaded: LoadedSpec, timeout_s: float) -> LoadedSpec:
    """The spec with the check workload as its command, bounded by ``timeout_s``."""
    spec = loaded.spec
    command = [spec.job.python, "-m", "worker_entry.check", "--deadline-s", f"{timeout_s:g}"]
    # the probes' per-run secret: in each task's environment (NodeConfig, never a command line; named
    # like a secret, so plan.json redacts it and Kubernetes keeps it in the job's Secret)
    env = {**spec.job.env, Env.CHECK_SECRET: secrets.token_hex(32)}
    job = spec.job.model_copy(
        update={
            "command": command,
            "env": env,
            "instrument": False,  # the check times its own collectives
            "startup_timeout_s": min(spec.job.startup_timeout_s, timeout_s),
            "stop_grace_s": min(spec.job.stop_grace_s, 2.0),
        }
    )
    checked = spec.model_copy(
        update={
            "job": job,
            "restart": spec.restart.model_copy(update={"max_restarts": 0}),
            "tensorboard": spec.tensorboard.model_copy(update={"enabled": False}),
            "metrics": spec.metrics.model_copy(update={"port": None}),
        }
    )
    return LoadedSpec(spec=checked, path=loaded.path, text=loaded.text, warnings=loaded.warnings)


def parse_line(text: str) -> dict[str, Any] | None:
    """The last ``TFCLUSTER_CHECK`` object in a task's log text (None: none, or not an object)."""
    payload = find_line(text)
    if payload is None:
        return None
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class CheckScheduling(RunScheduling):
    """The scheduler's own hooks, plus the check's judgement when the last task has ended."""

    def __init__(self, inner: RunScheduling, outcome: CheckOutcome, deadline_s: float | None = None) -> None:
        self.inner = inner
        self.outcome = outcome
        self.deadline_s = deadline_s
        self.signals = inner.signals

    def policy(self, spec: Any) -> Any:
        return self.inner.policy(spec)

    def open(self, job: RunContext) -> bool:
        return self.inner.open(job)

    def opened(self, job: RunContext) -> None:
        self.inner.opened(job)

    def completed_earlier(self, job: RunContext) -> str | None:
        return self.inner.completed_earlier(job)

    def hand_off(self, job: RunContext, decision: Decision) -> None:
        self.inner.hand_off(job, decision)

    def settle(self, job: RunContext, decision: Decision) -> None:
        self.inner.settle(job, decision)
        job.logs.flush()
        hosts = {str(n.task): n.host for n in job.plan.nodes}
        results: dict[str, dict[str, Any]] = {}
        phases: dict[str, str | None] = {}
        for n in job.plan.nodes:
            try:
                text = read_tail(job.rundir.task_log(n.task.slug), LOG_TAIL)
            except OSError:
                continue
            phases[str(n.task)] = node_phase(text)
            found = node_result(str(n.task), text, hosts)  # validated, and only what this node may claim
            if found is not None:
                results[str(n.task)] = found
        if not results and job.result.failures and not any(f.task for f in job.result.failures):
            return  # nothing started (no host reachable): the run's own failure says why
        failures = [*job.result.failures, *(f for a in job.result.attempts for f in a.failures)]
        for f in failures:  # a task without its line: the run's reason (lost, hung, exited)
            if f.task in hosts and f.task not in results:
                results[f.task] = {"task": f.task, "error": f"{f.kind}: {f.message}"}
        check = judge(results, hosts, phases, self.deadline_s)
        check["run_dir"] = str(job.rundir.path)
        check["wall_s"] = round(time.time() - job.result.started_ts, 2)
        check["nodes"] = {t: {k: v for k, v in r.items() if k not in ("links", "served")} for t, r in results.items()}
        write_json_atomic(job.rundir.path / "check.json", check)
        for f in check["findings"]:
            job.bus.emit(
                CheckFinding(
                    task=f["task"],
                    host=hosts.get(f["task"]) if f["task"] else None,
                    message=f["what"],
                    code=f["code"],
                    subject=f["subject"],
                    figure=f["figure"],
                    median=f["median"],
                )
            )
        self.outcome.check = check


def read_tail(path: Any, limit: int) -> str:
    """The last ``limit`` bytes of a file, as text."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode(errors="replace")


def run_check(
    loaded: LoadedSpec,
    timeout_s: float,
    run_dir: str,
    scheduler: Any,
    echo_logs: bool = False,
    run_id: str | None = None,
) -> tuple[Any, CheckOutcome]:
    """Launch the check through ``scheduler`` (plan, backend, scheduling); (the run's result, outcome)."""
    from .job import Job
    from .options import LaunchOptions

    if not scheduler.supervises_here():  # a Slurm login node: the supervisor would run in a batch job
        raise UsageError(
            f"{loaded.path}: tfcluster check supervises its tasks from this process; under scheduler: "
            f"{loaded.spec.scheduler} run it inside an allocation (salloc ... tfcluster check SPEC)"
        )
    checked = check_spec(loaded, timeout_s)
    plan = scheduler.plan(checked, run_id or f"{loaded.spec.name}-check-{int(time.time())}")
    outcome = CheckOutcome()
    opts = LaunchOptions(run_dir=run_dir, preflight=True, gather=False, live=False, echo_logs=echo_logs)
    job = Job(
        checked,
        plan,
        opts,
        scheduler.backend(checked, plan),
        scheduling=CheckScheduling(scheduler.scheduling(checked, plan), outcome, timeout_s),
    )
    return job.run(), outcome


def without_hosts(loaded: LoadedSpec, check: dict[str, Any], say: Callable[[str], None]) -> LoadedSpec:
    """The spec without the hosts the findings name (``check.without_named_hosts``); a UsageError when a
    finding names no one host of the list (a link between two fine hosts) or none would be left."""
    spec = loaded.spec
    by_task = {r["task"]: r["host"] for r in check["hosts"]}
    findings = check["findings"]
    if spec.hosts is None or any(f.get("task") not in by_task for f in findings):
        raise UsageError(
            "launch --check: the check named something that is not one host (see check.json); refusing to start"
        )
    named = {by_task[f["task"]] for f in findings}
    kept = [h for h in spec.hosts if h.address not in named]
    if not kept:
        raise UsageError("launch --check: the check named every host; refusing to start")
    say(f"tfcluster: starting without {', '.join(sorted(named))} (check.without_named_hosts: true)")
    return LoadedSpec(
        spec=spec.model_copy(update={"hosts": kept}), path=loaded.path, text=loaded.text, warnings=loaded.warnings
    )
