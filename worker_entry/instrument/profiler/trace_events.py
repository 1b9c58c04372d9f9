"""Parse a TensorFlow profiler trace (trace-events proto or XSpace) into per-step straggler signals.

Used only by the opt-in profiler sampler (``profiling.py``); see its docstring for what the signals mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Op types whose time is "inside a collective" (waiting for the peers and moving data).
COLLECTIVE_OPS = frozenset(
    {
        "CollectiveReduce",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "CollectiveReduceScatterV2",
        "CollectiveGather",
        "CollectiveGatherV2",
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "NcclAllReduce",
    }
)
# The executor's trace of a collective kernel being entered (its inputs are ready).
COLLECTIVE_ENTER = "CollectiveOpV2Kernel::Run"
# The iterator's trace around the blocking get_next of an input pipeline (TF 2.21), then op types.
INPUT_EVENT = "IteratorGetNextOp::DoCompute"
INPUT_OPS = frozenset(
    {"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "MultiDeviceIteratorGetNextFromShard"}
)
STEP_PREFIX = "EagerLocalExecute: __inference_"


@dataclass(frozen=True)
class Event:
    """One trace event, normalised from the trace-events proto or an XSpace."""

    name: str  # TraceMe name; for op events the op type
    thread: str  # resource / XLine name ("python", "tf_Compute/…", "collective_ops/…")
    start_ns: float
    dur_ns: float
    long_name: str = ""  # op events: "node/name:OpType"

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.dur_ns


# ------------------------------------------------------------------------------------------ parsing


def events_from_trace(data: bytes) -> list[Event]:
    """Events of the serialized ``tensorflow.profiler.Trace`` that ``ProfilerSession.stop()`` returns."""
    from tensorflow.tsl.profiler.protobuf import trace_events_pb2

    trace = trace_events_pb2.Trace()
    trace.ParseFromString(data)
    threads = {
        (device_id, rid): res.name
        for device_id, device in trace.devices.items()
        for rid, res in device.resources.items()
    }
    return [
        Event(
            e.name,
            threads.get((e.device_id, e.resource_id), ""),
            e.timestamp_ps / 1e3,
            e.duration_ps / 1e3,
            e.args.get("long_name", ""),
        )
        for e in trace.trace_events
    ]


def events_from_xspace(data: bytes) -> list[Event]:
    """Events of the host plane of a serialized XSpace (``*.xplane.pb`` written by ``export_to_tb``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(data)
    events: list[Event] = []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            thread = line.name or line.display_name
            base_ps = line.timestamp_ns * 1000
            for e in line.events:
                md = meta.get(e.metadata_id)
                raw = md.name if md is not None else ""
                name, long_name = raw, ""
                # TF op events are named "node/name:OpType" in the XSpace (TraceMe names such as
                # "IteratorGetNextOp::DoCompute" or "EagerLocalExecute: f" are not).
                if ":" in raw and "::" not in raw and " " not in raw and not raw.endswith(":"):
                    long_name, name = raw, raw.rsplit(":", 1)[1]
                events.append(Event(name, thread, (base_ps + e.offset_ps) / 1e3, e.duration_ps / 1e3, long_name))
    return events


@dataclass
class WindowSummary:
    """Per-step means over one profiled window (milliseconds)."""

    steps: int
    step_ms: float
    collective_ms: float
    input_ms: float
    pre_collective_ms: float | None
    pre_collective_steps: int = 0
    step_function: str = ""
    per_step_pre_collective_ms: list[float] = field(default_factory=list)


def _is_collective(e: Event) -> bool:
    return e.name in COLLECTIVE_OPS and (not e.long_name or e.long_name.endswith(":" + e.name))


def find_steps(events: Iterable[Event]) -> tuple[str, list[tuple[float, float]]]:
    """The step function and its executions: the ``EagerLocalExecute: __inference_*`` events of the
    (thread, function) pair with the largest total time (Keras: ``train_function``; custom loops: the
    function the loop calls).

    The thread is not matched by name: TF names the main thread after the process (``python``,
    ``python3``, ``python3.11``, a launcher script's name), so any fixed name misses some workers.
    """
    totals: dict[tuple[str, str], float] = {}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in events:
        if e.name.startswith(STEP_PREFIX):
            key = (e.thread, e.name)
            totals[key] = totals.get(key, 0.0) + e.dur_ns
            runs.setdefault(key, []).append((e.start_ns, e.end_ns))
    if not totals:
        return "", []
    key = max(totals, key=lambda k: totals[k])
    return key[1][len("EagerLocalExecute: ") :], sorted(runs[key])


def summarize(events: list[Event]) -> WindowSummary | None:
    """Per-step means of the straggler signals for one window; None if no step was found.

    Only events that start inside a step execution are counted, so partial steps at the window edges
    and work between steps (callbacks, Python) do not skew the means.
    """
    fn, steps = find_steps(events)
    if not steps:
        return None

    def step_of(t: float) -> int | None:
        # binary search for the step whose [start, end] contains t
        lo, hi = 0, len(steps) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            s, e = steps[mid]
            if t < s:
                hi = mid - 1
            elif t > e:
                lo = mid + 1
            else:
                return mid
        return None

    collective = 0.0
    input_event = 0.0
    input_ops = 0.0
    enter: dict[int, float] = {}
    first_collective: dict[int, float] = {}
    for e in events:
        idx = step_of(e.start_ns)
        if idx is None:
            continue
        if e.name == COLLECTIVE_ENTER:
            enter[idx] = min(enter.get(idx, e.start_ns), e.start_ns)
        elif _is_collective(e):
            collective += e.dur_ns
            first_collective[idx] = min(first_collective.get(idx, e.start_ns), e.start_ns)
        elif e.name == INPUT_EVENT:
            input_event += e.dur_ns
        elif e.name in INPUT_OPS:
            input_ops += e.dur_ns
    pre: list[float] = []
    for idx, (s, _) in enumerate(steps):
        t = enter.get(idx, first_collective.get(idx))
        if t is not None:
            pre.append((t - s) / 1e6)
    n = len(steps)
    return WindowSummary(
        steps=n,
        step_ms=sum(e - s for s, e in steps) / n / 1e6,
        collective_ms=collective / n / 1e6,
        input_ms=(input_event if input_event else input_ops) / n / 1e6,
        pre_collective_ms=(sum(pre) / len(pre)) if pre else None,
        pre_collective_steps=len(pre),
        step_function=fn,
        per_step_pre_collective_ms=pre,
    )
