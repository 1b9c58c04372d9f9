"""Straggler signals from short samples of the TensorFlow profiler — an explicit opt-in only.

The default source of ``profile`` records is the step clock (``stepclock.py``: timestamps inside the
train step, no profiler). This sampler runs only with ``TFCLUSTER_PROFILER=1`` (and a positive
``TFCLUSTER_PROFILE_INTERVAL_S``), because stopping a profiler session can crash TensorFlow 2.21
(see below). Its records carry ``"source": "profiler"``.

Under synchronous all-reduce every worker's wall step time is the same — the fast workers wait inside
the collective for the slow one — so step times cannot point at a straggler. What differs is *where*
each worker spends the step:

- ``pre_collective_ms``: per step, from the start of the step function's execution to the moment the
  first collective kernel of the step is entered (``CollectiveOpV2Kernel::Run``, i.e. this worker's
  gradients are ready and it joins the all-reduce; fallback: the start of the first ``CollectiveReduce*``
  op event). The straggler's is large, everyone else's small and flat.
- ``collective_ms``: time inside ``CollectiveReduce*`` ops per step (waiting for the peers + transfer);
  smallest for the straggler, but noisy between healthy workers.
- ``input_ms``: time inside ``IteratorGetNext`` per step: large for an input-bound straggler.
- ``cpu_ms``: process CPU time per step over the window: large for a compute-bound straggler.
- ``step_ms``: mean wall time of the step function.

``ProfileSampler`` profiles ~10 steps every ``TFCLUSTER_PROFILE_INTERVAL_S`` seconds (0/unset = off),
starting at a batch begin and stopping at a batch end, parses the result in a background thread and
emits one ``profile`` record. Any failure prints one warning and disables the sampler.

Known hazard (TF 2.21): stopping a profiler session can crash the process inside TensorFlow
(``TraceMeRecorder::Consume``: a use-after-free while merging cross-thread events). Measured in
multi-worker runs: about one crash per 20-60 windows per process, worse with py_function input
pipelines. It cannot be caught from Python, which is why the sampler never runs by default.
See docs/instrumentation.md.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...protocol.env import Env
from .. import progress
from ..progress import warn_once
from .trace_events import (  # noqa: F401 - re-exported: the sampler's parsing API
    COLLECTIVE_ENTER,
    COLLECTIVE_OPS,
    Event,
    WindowSummary,
    events_from_trace,
    events_from_xspace,
    find_steps,
    summarize,
)

ENV_OPT_IN = Env.PROFILER  # 1: use this sampler (instead of the step clock)
ENV_DEBUG = Env.PROFILE_DEBUG  # 1: one stderr line per window with its cost (experiments)
DEFAULT_WINDOW_STEPS = 10

# ------------------------------------------------------------------------------------------ sampler


def opted_in(env: Mapping[str, str] = os.environ) -> bool:
    """``TFCLUSTER_PROFILER=1``: the user accepts the crash risk of TF 2.21's profiler."""
    return (env.get(ENV_OPT_IN) or "").strip().lower() in ("1", "true", "yes", "on")


class _Session:
    """One profiler session: in memory (``ProfilerSession.stop()`` returns the trace-events proto in
    TF 2.21) or, if that is unavailable, a temporary logdir holding an ``.xplane.pb`` that we delete."""

    # Host ops only: the signals are host-side and device tracing (CUPTI) would add cost on GPUs.
    OPTIONS = {"host_tracer_level": 2, "python_tracer_level": 0, "device_tracer_level": 0}

    def __init__(self, in_memory: bool = True) -> None:
        from tensorflow.python.profiler import profiler_v2
        from tensorflow.python.profiler.internal import _pywrap_profiler

        if getattr(profiler_v2, "_profiler", None) is not None:
            raise _Busy("the program is profiling itself")
        self.in_memory = in_memory
        self.logdir = ""
        if not in_memory:
            import tempfile

            self.logdir = tempfile.mkdtemp(prefix="tfcluster-prof-")
        self._session = _pywrap_profiler.ProfilerSession()
        self._session.start(self.logdir, dict(self.OPTIONS))

    def stop(self) -> tuple[str, bytes]:
        """Stop tracing; returns ("trace", bytes) or ("xspace", bytes)."""
        if self.in_memory:
            data = self._session.stop()
            if isinstance(data, bytes) and data:
                return "trace", data
            raise RuntimeError("ProfilerSession.stop() returned no trace")
        try:
            self._session.export_to_tb()
            import glob

            files = glob.glob(os.path.join(self.logdir, "plugins", "profile", "*", "*.xplane.pb"))
            if not files:
                raise RuntimeError("the profiler wrote no .xplane.pb")
            with open(files[0], "rb") as f:
                return "xspace", f.read()
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        if self.logdir:
            import shutil

            shutil.rmtree(self.logdir, ignore_errors=True)
            self.logdir = ""


class _Busy(Exception):
    """Profiling is not possible right now (someone else is profiling): skip this window."""


class ProfileSampler:
    """Profiles ~``window_steps`` steps every ``interval_s`` seconds and emits ``profile`` records.

    Driven by a Keras callback (or a custom loop): call ``on_batch_begin()`` before and
    ``on_batch_end(steps)`` after each step. Costs nothing between windows but a clock read.
    """

    def __init__(
        self,
        interval_s: float,
        window_steps: int = DEFAULT_WINDOW_STEPS,
        emit: Callable[..., Any] = progress.emit,
        in_memory: bool = True,
        clock: Callable[[], float] = time.monotonic,
        first_delay_s: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.window_steps = max(1, int(window_steps))
        self.enabled = interval_s > 0
        self._emit = emit
        self._in_memory = in_memory
        self._clock = clock
        # The first window waits one interval (so it misses tracing and warm-up).
        delay = interval_s if first_delay_s is None else first_delay_s
        self._next_due = clock() + delay
        self._session: _Session | None = None
        self._window_steps = 0
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self._parser: threading.Thread | None = None
        self.windows = 0
        self.last_cost: dict[str, float] = {}
        self.last_record: dict[str, Any] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **kwargs: Any) -> ProfileSampler:
        """Enabled only with ``TFCLUSTER_PROFILER=1`` and a positive ``TFCLUSTER_PROFILE_INTERVAL_S``."""
        return cls(progress.profile_interval_from_env(env) if opted_in(env) else 0.0, **kwargs)

    def _disable(self, what: str, exc: BaseException) -> None:
        self.enabled = False
        warn_once("profiler-sampler", f"profiler sampling disabled ({what}: {exc!r}); training continues")
        if self._session is not None:
            try:
                self._session.cleanup()
            except Exception:
                pass
            self._session = None

    def on_batch_begin(self) -> None:
        """Start a window if one is due (and the previous one has been parsed)."""
        if not self.enabled or self._session is not None:
            return
        if self._clock() < self._next_due:
            return
        if self._parser is not None and self._parser.is_alive():
            return
        try:
            t0 = time.perf_counter()
            self._session = _Session(self._in_memory)
            self.last_cost = {"start_ms": (time.perf_counter() - t0) * 1e3}
        except _Busy:
            self._next_due = self._clock() + self.interval_s
            return
        except Exception as exc:
            self._disable("start", exc)
            return
        self._window_steps = 0
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()

    def on_batch_end(self, steps: int = 1) -> None:
        """Count steps of an open window; stop it after ``window_steps`` steps."""
        if self._session is None:
            return
        self._window_steps += max(1, int(steps))
        if self._window_steps < self.window_steps:
            return
        self._finish()

    def _finish(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        cpu = time.process_time() - self._cpu0
        steps = self._window_steps
        self._next_due = self._clock() + self.interval_s
        try:
            t0 = time.perf_counter()
            kind, data = session.stop()
            self.last_cost["stop_ms"] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:
            self._disable("stop", exc)
            return
        self.windows += 1
        cpu_ms = cpu * 1e3 / steps if steps else None
        self._parser = threading.Thread(
            target=self._parse, args=(kind, data, cpu_ms), name="tfcluster-profile-parse", daemon=True
        )
        self._parser.start()

    def _parse(self, kind: str, data: bytes, cpu_ms: float | None) -> None:
        try:
            t0 = time.perf_counter()
            events = events_from_trace(data) if kind == "trace" else events_from_xspace(data)
            summary = summarize(events)
            self.last_cost["parse_ms"] = (time.perf_counter() - t0) * 1e3
            if os.environ.get(ENV_DEBUG) == "1":
                costs = " ".join(f"{k}={v:.2f}" for k, v in self.last_cost.items())
                names = sorted({e.name for e in events})[:40]
                print(
                    f"tfcluster-profile window={self.windows} {costs} events={len(events)} names={names}",
                    file=sys.stderr,
                )
            if summary is None:
                return
            record = {
                "steps": summary.steps,
                "step_ms": round(summary.step_ms, 3),
                "collective_ms": round(summary.collective_ms, 3),
                "input_ms": round(summary.input_ms, 3),
                "pre_collective_ms": None if summary.pre_collective_ms is None else round(summary.pre_collective_ms, 3),
                "cpu_ms": None if cpu_ms is None else round(cpu_ms, 3),
                "source": "profiler",
            }
            self.last_record = record
            self._emit("profile", **record)
        except Exception as exc:
            self._disable("parse", exc)

    def close(self, wait_s: float = 5.0) -> None:
        """Discard an open window and wait briefly for a pending parse (so its record is not lost)."""
        session, self._session = self._session, None
        if session is not None:
            try:
                session.stop()
            except Exception:
                pass
            session.cleanup()
        parser = self._parser
        if parser is not None and parser.is_alive():
            parser.join(wait_s)
