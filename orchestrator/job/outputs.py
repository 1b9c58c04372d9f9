"""Where a run's output goes while it runs: events (events.jsonl, console, metrics), lines (per-task
logs, combined.log, console), heartbeats, status.json and the live table — wired once per run.

A full disk never takes the job down (``WriteGuard``: one warning), and a terminal that goes away
(SIGHUP) moves the console into RUN/launcher.log while the job goes on.
"""

from __future__ import annotations

import sys
from typing import Any

from ..backends.limits import OPEN_EVENT_FILES, OPEN_LOGS
from ..events import EventBus, read_events
from ..events import kinds as ev
from ..events.evaluations import Evaluations
from ..plan import Plan
from ..runs import RunDir
from ..sinks import ConsoleSink, EventFileSink, HeartbeatFile, LogRouter, WriteGuard, use_color
from ..sinks.status import StatusWriter
from ..spec import ClusterSpec
from ..supervise.figures import Figures
from .signals import Hangup


class _ProfileTee:
    """heartbeats.jsonl, and the latest profile record of each task to the metrics."""

    def __init__(self, sink: Any, metrics: Any) -> None:
        self.sink = sink
        self.metrics = metrics

    def write(self, task: str, record: dict[str, Any]) -> None:
        self.sink.write(task, record)
        if record.get("kind") == "profile":
            self.metrics.profile(task, record)

    def close(self) -> None:
        self.sink.close()


class _Tee:
    """heartbeats.jsonl, and every record to another sink (TensorBoard: it only queues them)."""

    def __init__(self, sink: Any, other: Any) -> None:
        self.sink = sink
        self.other = other

    def write(self, task: str, record: dict[str, Any]) -> None:
        self.sink.write(task, record)
        self.other.write(task, record)

    def close(self) -> None:
        self.sink.close()


class RunOutputs:
    def __init__(
        self,
        rundir: RunDir,
        plan: Plan,
        *,
        live: bool,
        echo_logs: bool,
        max_log_bytes: int | None = None,
        all_output: bool = False,
        open_files: tuple[int, int] = (OPEN_LOGS, OPEN_EVENT_FILES),
    ) -> None:
        self.plan = plan
        self.open_files = open_files  # (task logs, event files) open at once: ``backends.limits.open_files``
        self.elastic: dict[str, Any] | None = None  # status.json's "elastic": hosts excluded, spares left
        self.live: Any = None
        if live and echo_logs and use_color(sys.stdout) and sys.stdout.isatty():
            from ..sinks.live import LiveTable

            self.live = LiveTable(plan)
        self.guard = WriteGuard()  # the run directory may fill up mid-run: one warning, the job goes on
        self.bus = EventBus([EventFileSink(rundir.events_jsonl, self.guard), ConsoleSink()])
        self.logs = LogRouter(rundir, echo=echo_logs, guard=self.guard, all_output=all_output, open_logs=open_files[0])
        self.logs.limit(max_log_bytes, self._log_cut)  # a flooding task costs neither disk nor memory
        if self.live is not None:
            self.logs.console_hook = self.live.print_log
            self.logs.progress_hook = self.live.progress  # progress bars redrawn in place above the table
        self.heartbeats: Any = HeartbeatFile(rundir.heartbeats_jsonl, self.guard)
        self.figures = Figures.replay(rundir.heartbeats_jsonl)  # a continued run's records count too
        # an evaluator's evaluations over the run (a continued run's earlier ones too): status counts them all
        self.evaluations = Evaluations.of(read_events(rundir.events_jsonl))
        self.status_file = StatusWriter(rundir, plan.job, plan.run_id, self.live, self.figures)
        self.hangup = Hangup(rundir.launcher_log)
        self.metrics: Any = None
        self.metrics_server: Any = None
        self.tensorboard: Any = None
        self.rundir = rundir

    def _log_cut(self, task: str, host: str | None, limit: int, attempt: int) -> None:
        self.bus.emit(
            ev.LogCut(
                task=task,
                host=host,
                message=f"{task}'s output passed logs.max_bytes_per_task ({limit} bytes): the launcher keeps no "
                "more of it; its node keeps its own complete log",
                limit=limit,
                attempt=attempt,
            )
        )

    def start_metrics(self, spec: ClusterSpec, port: int | None) -> dict[str, Any]:
        """Serve Prometheus metrics while the job runs (when asked); what launcher.json records."""
        port = port if port is not None else spec.metrics.port
        if port is None:
            return {}
        from ..sinks.metrics import JobMetrics, MetricsServer

        self.metrics = JobMetrics(self.plan.job, self.plan.run_id)
        try:
            self.metrics_server = MetricsServer(self.metrics, spec.metrics.address, port)
        except OSError as exc:
            self.metrics = None
            self.bus.emit(ev.JobWarning(message=f"cannot serve metrics on {spec.metrics.address}:{port}: {exc}"))
            return {}
        self.bus.subscribe(self.metrics)
        self.heartbeats = _ProfileTee(self.heartbeats, self.metrics)
        self.bus.emit(ev.MetricsServed(url=self.metrics_server.url))
        return {"metrics_url": self.metrics_server.url}

    def start_tensorboard(self, spec: ClusterSpec, own_dir: str | None) -> dict[str, Any]:
        """Write TensorBoard scalars while the job runs (unless the spec turns them off); what
        launcher.json records (where they go: the run's end is added there after it)."""
        if not spec.tensorboard.enabled and own_dir is None:
            return {}
        from ..sinks.tensorboard import TensorBoardSink, tensorboard_root

        root = tensorboard_root(self.rundir, self.plan.run_id, own_dir or spec.tensorboard.dir)
        try:
            history = self.rundir.heartbeats_jsonl if self.rundir.heartbeats_jsonl.exists() else None
            self.tensorboard = TensorBoardSink(
                root, [str(n.task) for n in self.plan.nodes], history=history, open_files=self.open_files[1]
            )
        except ImportError as exc:
            self.bus.emit(ev.JobWarning(message=f"no TensorBoard files: {exc} (pip install tensorboardX)"))
            return {}
        except OSError as exc:
            self.bus.emit(
                ev.JobWarning(message=f"no TensorBoard files: cannot write under {root}: {exc.strerror or exc}")
            )
            return {}
        self.heartbeats = _Tee(self.heartbeats, self.tensorboard)
        self.bus.subscribe(self.tensorboard)  # evaluations: one point each
        return {"tensorboard_dir": str(root.resolve())}

    def status(self, status: dict[str, Any]) -> None:
        """Every second, from the supervisor's loop: the live status, and a hangup acted on."""
        if self.hangup.count > self.hangup.handled:
            self.hangup.handled = self.hangup.count
            self.stop_live()
            self.live = self.status_file.live = self.logs.console_hook = self.logs.progress_hook = None
            self.logs.color = False
            for sink in self.bus.sinks:
                if isinstance(sink, ConsoleSink):
                    sink.color = False
            self.bus.emit(
                ev.Detached(
                    message=f"the terminal went away (SIGHUP): the job goes on; output in {self.hangup.log}",
                    log=str(self.hangup.log),
                )
            )
        if self.elastic is not None:
            status.setdefault("elastic", self.elastic)
        if self.metrics is not None:
            self.metrics.update(status)
        if self.tensorboard is not None:
            self.tensorboard.update(status)
        self.status_file(status)

    def replan(self, plan: Plan, elastic: dict[str, Any] | None) -> None:
        """A reshaped attempt's plan (issue 34): the live table's rows, and what status.json shows of
        the hosts excluded and the spares left (``elastic``)."""
        self.plan = plan
        self.elastic = elastic
        if self.live is not None:
            self.live.plan = plan

    def start_live(self) -> None:
        if self.live is not None:
            self.live.start()

    def stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()

    def close_files(self) -> None:
        """Every line and sample on disk (before result.json says the run is over: ``logs -f``)."""
        self.logs.close()
        self.heartbeats.close()

    def close(self) -> None:
        self.stop_live()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
            for problem in self.tensorboard.problems:  # the bus is closed by now
                print(f"tfcluster: warning: {problem}", file=sys.stderr)
