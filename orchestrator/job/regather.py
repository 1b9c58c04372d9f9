"""`tfcluster gather RUN`: reconnect with the run's saved spec and finish (or redo) its gather."""

from __future__ import annotations

from typing import Any

from ..core.errors import ConnectError, GatherError, UsageError
from ..events import EventBus
from ..plan import load_plan
from ..runs import RunDir, write_json_atomic
from ..sinks import ConsoleSink, EventFileSink
from ..transfer import gather_after_run


def gather_run(rundir: RunDir) -> dict[str, Any]:
    from ..backends.ssh import SshBackend

    plan_data = rundir.read_json(rundir.plan_json) or {}
    loaded, plan = load_plan(str(rundir.spec_yaml), plan_data.get("run_id"))
    if plan.scheduler == "kubernetes":
        raise UsageError(
            "nothing to gather on Kubernetes: every pod's log came through the API into the run directory, "
            "and checkpoints are on kubernetes.volume"
        )
    result = rundir.read_json(rundir.result_json) or {}
    attempts = max(1, len(result.get("attempts", [])))
    backend = SshBackend()
    try:
        problems = backend.connect(plan.nodes)
        if problems:
            raise ConnectError(problems)
        bus = EventBus([EventFileSink(rundir.events_jsonl), ConsoleSink()])
        try:
            conns = {str(n.task): backend.connection(str(n.task)) for n in plan.nodes}
            summary = gather_after_run(loaded.spec, plan, conns, rundir, bus, attempts=attempts)
        finally:
            bus.close()
        if summary.get("errors"):
            raise GatherError("; ".join(summary["errors"][:5]))
        if result:
            result["gather"] = summary
            result["gather_error"] = None
            write_json_atomic(rundir.result_json, result)
        return summary
    finally:
        backend.close()
