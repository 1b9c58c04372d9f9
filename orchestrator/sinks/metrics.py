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

from ..core.states import TaskState
from ..events import BaseEvent
from ..events.kinds import JobStalled, Restart, Straggler, WorkerHung, WorkerLost
from .recovery import Recoveries, RecoveryWatch

#: profile record fields (milliseconds) exported as tfcluster_task_step_part_seconds{part=...}: the step
#: clock's parts (they add up to ``step``), and ``pre_collective``, the worker's own work per step
SPLIT_PARTS = (
    "input_ms",
    "compute_ms",
    "collective_ms",
    "update_ms",
    "host_ms",
    "other_ms",
    "pre_collective_ms",
    "step_ms",
)


#: Label values a node chooses (a GPU's index, its clock-event reasons, an evaluation's metric names): at
#: most this many distinct values per label and task over the run. A node that changes them every
#: heartbeat would otherwise make a new series each time in the Prometheus that scrapes us.
MAX_LABEL_VALUES = 32


class LabelBound:
    """The distinct node-chosen label values admitted so far, per (label, task); later new ones are dropped
    (counted: ``tfcluster_metric_labels_dropped_total``)."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: dict[tuple[str, str], set[str]] = {}
        self.dropped = 0

    def admit(self, label: str, task: str, value: str) -> bool:
        values = self.seen.setdefault((label, task), set())
        if value in values:
            return True
        if len(values) >= self.limit:
            self.dropped += 1
            return False
        values.add(value)
        return True


class JobMetrics:
    """The state the collector reads: the latest status and counters from events. Also an event sink."""

    def __init__(self, job: str, run_id: str) -> None:
        self.job = job
        self.run_id = run_id
        self.labels = LabelBound()
        self.status: dict[str, Any] = {}
        self.profiles: dict[str, dict[str, Any]] = {}
        self.restarts = 0
        self.stragglers = 0
        self.verdicts = 0
        self.detection_s: float | None = None
        self.recovery = RecoveryWatch()  # the cost of each failure: loss to training again, work redone
        self._lock = threading.Lock()  # held only to swap or copy a reference: the decision loop takes it
        # The label bound's, held by a scrape while it builds every task's samples (seconds at thousands of
        # tasks, on a loaded box): the decision loop never waits for it (it did, and stalled past the
        # heartbeat timeout at 1,024 tasks: docs/benchmarks.md §11).
        self._scrape_lock = threading.Lock()

    def update(self, status: dict[str, Any]) -> None:
        with self._lock:
            self.status = status
            self.recovery.update(status)

    def profile(self, task: str, record: dict[str, Any]) -> None:
        with self._lock:
            self.profiles[task] = record

    # --- event sink -----------------------------------------------------------------------------
    def handle(self, event: BaseEvent) -> None:
        with self._lock:
            self.recovery.handle(event)
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
            return (
                dict(self.status),
                dict(self.profiles),
                (self.restarts, self.stragglers, self.verdicts, self.detection_s),
            )

    def recoveries(self) -> Recoveries:
        with self._lock:
            done = self.recovery.done
            return Recoveries(
                dict(done.count),
                done.last_loss_to_training_s,
                done.loss_to_training_s,
                done.work_redone_steps,
                done.work_redone_s,
            )


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
        d = GaugeMetricFamily(
            "tfcluster_job_detection_latency_seconds",
            "Evidence of the last lost/hung verdict: how long the worker had been silent or stopped",
            labels=["job"],
        )
        if detection is not None:  # declared always (no sample before a verdict): dashboards can name it
            d.add_metric([job], detection)
        yield d
        yield from _recovery_figures(job, self.m.recoveries())
        yield from _job_figures(job, status)
        with self.m._scrape_lock:  # scrapes may come from several threads: the bound is one
            families = list(_task_metrics(job, status.get("tasks") or {}, profiles, self.m.labels))
            dropped = self.m.labels.dropped
        yield from families
        c = CounterMetricFamily(
            "tfcluster_metric_labels_dropped",
            f"Samples left out: a node-chosen label value beyond {MAX_LABEL_VALUES} distinct ones per label and task",
            labels=["job"],
        )
        c.add_metric([job], dropped)
        yield c


def _recovery_figures(job: str, done: Recoveries) -> Iterator[Any]:
    """What the failures recovered from cost (``sinks.recovery``): by cause, the last one, the sums."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    c = CounterMetricFamily(
        "tfcluster_job_recoveries",
        "Failures the job trained again after, by cause (host_lost: on a new plan without the host; restart)",
        labels=["job", "cause"],
    )
    for cause in ("host_lost", "restart"):  # both always: a dashboard can name them before any failure
        c.add_metric([job, cause], done.count.get(cause, 0))
    yield c
    g = GaugeMetricFamily(
        "tfcluster_job_last_loss_to_training_seconds",
        "The last failure: from the culprit's last sign of life (or the failure) to the next attempt's first step",
        labels=["job"],
    )
    if done.last_loss_to_training_s is not None:
        g.add_metric([job], done.last_loss_to_training_s)
    yield g
    for name, doc, value in (
        (
            "tfcluster_job_loss_to_training_seconds",
            "Loss to training again, summed over the failures",
            done.loss_to_training_s,
        ),
        (
            "tfcluster_job_work_redone_steps",
            "Steps run between the last backup and a failure (run again)",
            done.work_redone_steps,
        ),
        (
            "tfcluster_job_work_redone_seconds",
            "Training time between the last backup and a failure",
            done.work_redone_s,
        ),
    ):
        c = CounterMetricFamily(name, doc, labels=["job"])
        c.add_metric([job], value)
        yield c


def _job_figures(job: str, status: dict[str, Any]) -> Iterator[Any]:
    """The job's rates (one worker's: every worker counts the global batch) and its tasks by state."""
    from prometheus_client.core import GaugeMetricFamily

    rates = status.get("throughput") if isinstance(status.get("throughput"), dict) else {}
    for key, name, doc in (
        ("steps_per_s", "tfcluster_job_steps_per_second", "The job's training steps per second (the workers' median)"),
        (
            "examples_per_s",
            "tfcluster_job_examples_per_second",
            "The job's examples per second (global batch x steps/s)",
        ),
    ):
        fam = GaugeMetricFamily(name, doc, labels=["job"])
        if (number := _finite(rates.get(key))) is not None:
            fam.add_metric([job], number)
        yield fam
    counts = dict.fromkeys((s.value for s in TaskState), 0)
    for t in (status.get("tasks") or {}).values():
        if isinstance(t, dict) and t.get("state") in counts:
            counts[t["state"]] += 1
    fam = GaugeMetricFamily("tfcluster_job_tasks", "Tasks in each state", labels=["job", "state"])
    for state, n in counts.items():
        fam.add_metric([job, state], n)
    yield fam


def _task_metrics(
    job: str, tasks: dict[str, Any], profiles: dict[str, dict[str, Any]], bound: LabelBound
) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    labels = ["job", "task", "host"]

    def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

    fams = {
        "steps": family("tfcluster_task_steps", "Training steps done (cumulative within the attempt)"),
        "steps_per_s": family("tfcluster_task_steps_per_second", "Training steps per second"),
        "examples_per_s": family("tfcluster_task_examples_per_second", "Examples per second (global batch)"),
        "step_time": family("tfcluster_task_step_seconds", "Mean wall time of a step over the last window"),
        "loss": family("tfcluster_task_train_loss", "Training loss: the mean over the last interval between records"),
        "age": family("tfcluster_task_heartbeat_age_seconds", "Seconds since the task's last heartbeat"),
        "cpu": family("tfcluster_task_cpu_ratio", "CPU of the task's processes (1.0 = one core busy)"),
        "rss": family("tfcluster_task_memory_rss_bytes", "Resident memory of the task's processes"),
        "up": family("tfcluster_task_up", "1 while the task runs"),
        "part": family(
            "tfcluster_task_step_part_seconds", "Time per step in each part (the step clock's last window)", ("part",)
        ),
        "gpu_util": family("tfcluster_task_gpu_utilization_ratio", "GPU utilisation", ("gpu",)),
        "gpu_mem": family("tfcluster_task_gpu_memory_used_bytes", "GPU memory used", ("gpu",)),
        "gpu_clock": family("tfcluster_task_gpu_sm_clock_hertz", "GPU SM clock", ("gpu",)),
        **_health_families(family),
        "evaluations": family("tfcluster_task_evaluations", "Evaluations an evaluator task made (this run)"),
        "eval_step": family(
            "tfcluster_task_evaluation_step", "Training step of the weights an evaluator evaluated last"
        ),
        "eval_metric": family(
            "tfcluster_task_evaluation_metric",
            "An evaluator's last evaluation: each metric as it reported it",
            ("metric",),
        ),
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
        put("loss", t.get("loss"))
        put("age", t.get("last_heartbeat_age_s"))
        put("cpu", t.get("cpu_pct"), 0.01)
        put("rss", t.get("rss_mb"), 1 << 20)
        fams["up"].add_metric(base, 1.0 if t.get("state") in ("running", "ready", "starting", "stopping") else 0.0)
        fams["straggler"].add_metric(base, 1.0 if t.get("straggler") else 0.0)
        put("relative", t.get("relative_score"))
        put("individual", t.get("individual_score"))
        for part in SPLIT_PARTS:
            put("part", (profiles.get(task) or {}).get(part), 0.001, (part.removesuffix("_ms"),))
        for g in t.get("gpus") or []:
            idx = (str(g.get("index")),)
            if not bound.admit("gpu", task, idx[0]):
                continue
            put("gpu_util", g.get("util"), 0.01, idx)
            put("gpu_mem", g.get("mem_used_mb"), 1 << 20, idx)
            put("gpu_clock", g.get("sm_clock_mhz"), 1e6, idx)
            put("gpu_clock_max", g.get("sm_clock_max_mhz"), 1e6, idx)
            put("gpu_mem_total", g.get("mem_total_mb"), 1 << 20, idx)
            put("gpu_temp", g.get("temp_c"), 1.0, idx)
            put("gpu_power", g.get("power_w"), 1.0, idx)
            put("gpu_limit", g.get("power_limit_w"), 1.0, idx)
            put("gpu_xid", g.get("xid_errors"), 1.0, idx)
            put("gpu_ecc", g.get("ecc_uncorrected"), 1.0, idx)
            for reason in g.get("throttle") or []:
                if isinstance(reason, str) and bound.admit("reason", task, reason):
                    put("gpu_event", 1, 1.0, (*idx, reason))
        for prob in t.get("gpu_problems") or []:
            put("gpu_problem", 1, 1.0, (str(prob.get("gpu")), str(prob.get("problem"))))
        if isinstance(e := t.get("evaluation"), dict):  # an evaluator's last evaluation (status: events.evaluations)
            put("evaluations", e.get("evaluations"))
            put("eval_step", e.get("step"))
            for metric, value in (e.get("metrics") if isinstance(e.get("metrics"), dict) else {}).items():
                if bound.admit("metric", task, str(metric)):
                    put("eval_metric", value, 1.0, (str(metric),))
    yield from fams.values()


def _health_families(family: Any) -> dict[str, Any]:
    """Straggler scores and GPU health (what the Grafana dashboard, docs/grafana/tfcluster.json, shows)."""
    return {
        "straggler": family("tfcluster_task_straggler", "1 while the task is the named straggler"),
        "relative": family(
            "tfcluster_task_relative_score", "Fastest worker's own work per step / this worker's (1 = fastest)"
        ),
        "individual": family(
            "tfcluster_task_individual_score", "This worker's best own work per step / now (1 = at its best)"
        ),
        "gpu_clock_max": family("tfcluster_task_gpu_sm_clock_max_hertz", "GPU maximum SM clock", ("gpu",)),
        "gpu_mem_total": family("tfcluster_task_gpu_memory_total_bytes", "GPU memory", ("gpu",)),
        "gpu_temp": family("tfcluster_task_gpu_temperature_celsius", "GPU temperature", ("gpu",)),
        "gpu_power": family("tfcluster_task_gpu_power_watts", "GPU power draw", ("gpu",)),
        "gpu_limit": family("tfcluster_task_gpu_power_limit_watts", "GPU enforced power limit", ("gpu",)),
        "gpu_xid": family("tfcluster_task_gpu_xid_errors", "Critical XID errors seen on the GPU", ("gpu",)),
        "gpu_ecc": family("tfcluster_task_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors (volatile)", ("gpu",)),
        "gpu_event": family(
            "tfcluster_task_gpu_clock_event", "1 per reason the GPU's clock is held down now (NVML)", ("gpu", "reason")
        ),
        "gpu_problem": family(
            "tfcluster_task_gpu_problem",
            "1 per problem of a GPU, as the monitor judges it (fault, shared, power limit, slow: docs/instrumentation.md)",
            ("gpu", "problem"),
        ),
    }


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
