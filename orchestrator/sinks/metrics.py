"""Prometheus metrics of a running job, served by the launcher (`launch --metrics-port`, `metrics.port`).

prometheus_client does the exposition format and the HTTP server; a custom collector reads the live
status snapshot (updated every second) and a few counters kept from events, at scrape time — no
second copy of the state to keep in step. Names follow Prometheus conventions: ``tfcluster_`` prefix,
base units (``_seconds``, ``_bytes``, ``_ratio``), ``_total`` for counters, labels ``job``, ``task``,
``host`` (and ``gpu``, ``part``, ``state``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

from ..events import BaseEvent
from ..events.kinds import JobStalled, Restart, Straggler, WorkerHung, WorkerLost

#: profile record fields (milliseconds) exported as tfcluster_task_step_part_seconds{part=...}
SPLIT_PARTS = (
    "input_ms",
    "compute_ms",
    "pre_collective_ms",
    "wait_ms",
    "collective_ms",
    "post_collective_ms",
    "step_ms",
)


class JobMetrics:
    """The state the collector reads: the latest status and counters from events. Also an event sink."""

    def __init__(self, job: str, run_id: str) -> None:
        self.job = job
        self.run_id = run_id
        self.status: dict[str, Any] = {}
        self.profiles: dict[str, dict[str, Any]] = {}
        self.restarts = 0
        self.stragglers = 0
        self.verdicts = 0
        self.detection_s: float | None = None
        self._lock = threading.Lock()

    def update(self, status: dict[str, Any]) -> None:
        with self._lock:
            self.status = status

    def profile(self, task: str, record: dict[str, Any]) -> None:
        with self._lock:
            self.profiles[task] = record

    # --- event sink -----------------------------------------------------------------------------
    def handle(self, event: BaseEvent) -> None:
        with self._lock:
            if isinstance(event, Restart):
                self.restarts += 1
            elif isinstance(event, Straggler):
                self.stragglers += 1
            elif isinstance(event, WorkerLost | WorkerHung | JobStalled):
                self.verdicts += 1
                if isinstance(event, WorkerLost):  # the evidence: how long it had been silent or stopped
                    self.detection_s = float(event.silent_s)
                elif isinstance(event, WorkerHung) and event.stopped_s is not None:
                    self.detection_s = float(event.stopped_s)

    def close(self) -> None:
        pass

    def snapshot(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]], tuple[int, int, int, float | None]]:
        with self._lock:
            return dict(self.status), dict(self.profiles), (self.restarts, self.stragglers, self.verdicts, self.detection_s)


class _Collector:
    def __init__(self, metrics: JobMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        status, profiles, (restarts, stragglers, verdicts, detection) = self.m.snapshot()
        job = self.m.job
        info = InfoMetricFamily("tfcluster_job", "The job this launcher runs", labels=["job"])
        info.add_metric([job], {"run_id": self.m.run_id, "state": str(status.get("state", "starting"))})
        yield info
        state = GaugeMetricFamily("tfcluster_job_state", "1 for the job's current state", labels=["job", "state"])
        state.add_metric([job, str(status.get("state", "starting"))], 1)
        yield state
        attempt = GaugeMetricFamily("tfcluster_job_attempt", "Current attempt (0 = first run)", labels=["job"])
        attempt.add_metric([job], _finite(status.get("attempt")) or 0.0)
        yield attempt
        for name, doc, value in (
            ("tfcluster_job_restarts", "Whole-job restarts after a failure", restarts),
            ("tfcluster_job_straggler_events", "Confirmed straggler events", stragglers),
            ("tfcluster_job_failure_verdicts", "Lost, hung or stalled verdicts", verdicts),
        ):
            c = CounterMetricFamily(name, doc, labels=["job"])
            c.add_metric([job], value)
            yield c
        if detection is not None:
            d = GaugeMetricFamily(
                "tfcluster_job_detection_latency_seconds",
                "Evidence of the last lost/hung verdict: how long the worker had been silent or stopped",
                labels=["job"],
            )
            d.add_metric([job], detection)
            yield d
        yield from _task_metrics(job, status.get("tasks") or {}, profiles)


def _task_metrics(job: str, tasks: dict[str, Any], profiles: dict[str, dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    labels = ["job", "task", "host"]

    def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

    fams = {
        "steps": family("tfcluster_task_steps", "Training steps done (cumulative within the attempt)"),
        "steps_per_s": family("tfcluster_task_steps_per_second", "Training steps per second"),
        "examples_per_s": family("tfcluster_task_examples_per_second", "Examples per second (global batch)"),
        "step_time": family("tfcluster_task_step_seconds", "Mean wall time of a step over the last window"),
        "age": family("tfcluster_task_heartbeat_age_seconds", "Seconds since the task's last heartbeat"),
        "cpu": family("tfcluster_task_cpu_ratio", "CPU of the task's processes (1.0 = one core busy)"),
        "rss": family("tfcluster_task_memory_rss_bytes", "Resident memory of the task's processes"),
        "up": family("tfcluster_task_up", "1 while the task runs"),
        "part": family("tfcluster_task_step_part_seconds", "Median time per step in each part (step clock)", ("part",)),
        "gpu_util": family("tfcluster_task_gpu_utilization_ratio", "GPU utilisation", ("gpu",)),
        "gpu_mem": family("tfcluster_task_gpu_memory_used_bytes", "GPU memory used", ("gpu",)),
        "gpu_clock": family("tfcluster_task_gpu_sm_clock_hertz", "GPU SM clock", ("gpu",)),
    }
    for task, t in sorted(tasks.items()):
        base = [job, task, str(t.get("host") or "")]

        def put(key: str, value: Any, scale: float = 1.0, extra: tuple[str, ...] = (), base: list[str] = base) -> None:
            if (number := _finite(value)) is not None:
                fams[key].add_metric([*base, *extra], number * scale)

        put("steps", t.get("steps"))
        put("steps_per_s", t.get("steps_per_s"))
        put("examples_per_s", t.get("examples_per_s"))
        put("step_time", t.get("step_time_s"))
        put("age", t.get("last_heartbeat_age_s"))
        put("cpu", t.get("cpu_pct"), 0.01)
        put("rss", t.get("rss_mb"), 1 << 20)
        fams["up"].add_metric(base, 1.0 if t.get("state") in ("running", "ready", "starting", "stopping") else 0.0)
        for part in SPLIT_PARTS:
            put("part", (profiles.get(task) or {}).get(part), 0.001, (part.removesuffix("_ms"),))
        for g in t.get("gpus") or []:
            idx = (str(g.get("index")),)
            put("gpu_util", g.get("util"), 0.01, idx)
            put("gpu_mem", g.get("mem_used_mb"), 1 << 20, idx)
            put("gpu_clock", g.get("sm_clock_mhz"), 1e6, idx)
    yield from fams.values()


def _finite(value: Any) -> float | None:
    """A figure as a float, or None: what a node reported must never fail a scrape (a 401-digit
    number overflows ``float``; NaN and infinities are no figures)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class MetricsServer:
    """The HTTP endpoint (prometheus_client's server, a daemon thread); ``url`` once started."""

    def __init__(self, metrics: JobMetrics, address: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(metrics))  # type: ignore[arg-type]
        started = start_http_server(port, addr=address, registry=self.registry)
        self._server = started[0] if isinstance(started, tuple) else None
        bound = self._server.server_address[1] if self._server is not None else port
        host = f"[{address}]" if ":" in address else address
        self.url = f"http://{host}:{bound}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
