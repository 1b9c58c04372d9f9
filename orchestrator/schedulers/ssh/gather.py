"""`tfcluster gather RUN`: reconnect with the run's saved spec and finish (or redo) its gather."""

from __future__ import annotations

from typing import Any

from ...backends.ssh import SshBackend
from ...core.errors import ConnectError, GatherError
from ...events import EventBus
from ...plan import Plan
from ...runs import RunDir
from ...sinks import ConsoleSink, EventFileSink
from ...sinks.record import record_gather
from ...spec import LoadedSpec
from ...transfer import gather_after_run


def gather_run(rundir: RunDir, loaded: LoadedSpec, plan: Plan) -> dict[str, Any]:
    """Copy what the run left on its nodes (complete logs, the chief's checkpoint), verified and
    resumable; result.json then records the gather."""
    result = rundir.read_json(rundir.result_json)
    listed = result.get("attempts") if isinstance(result, dict) else None
    attempts = max(1, len(listed) if isinstance(listed, list) else 0)
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
        record_gather(rundir, summary)
        return summary
    finally:
        backend.close()
