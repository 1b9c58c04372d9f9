"""Run-directory records the views can compute with: a hostile or damaged run directory (a torn line,
a hand-edited file, a record with a string where a number belongs) must give a report, not a traceback.

A heartbeat or profile record whose known numeric fields are not finite numbers is skipped (the
protocol refused such a message on receipt, so only a damaged file has one); a bad optional part
(``progress``, ``host``, ``gpus``) is dropped from its record. Unknown fields pass untouched: newer
launchers may add some. The known fields come from the protocol's own records. Events are typed events
(``events.read_events``, with its own rules for damaged lines).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import typing
from pathlib import Path
from typing import Any

from worker_entry import protocol as p

from ..events import BaseEvent, read_events
from ..runs import RunDir, read_jsonl


def _numeric(cls: type) -> dict[str, tuple[float, float]]:
    """Fields of a protocol record typed int or float (optional or not), with their allowed range."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        args = set(typing.get_args(hints[f.name]) or (hints[f.name],)) - {type(None)}
        if args and args <= {int, float}:
            lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
            out[f.name] = (-math.inf if lo is None else lo, math.inf if hi is None else hi)
    return out


HEARTBEAT_NUMERIC = _numeric(p.Heartbeat)
PROFILE_NUMERIC = _numeric(p.Profile)
PROGRESS_NUMERIC = _numeric(p.Progress)
HOST_NUMERIC = _numeric(p.HostSample)
GPU_NUMERIC = _numeric(p.GpuSample)


def is_number(x: Any) -> bool:
    """A finite int or float, not a bool. The exact JSON types first: a report calls this a few million
    times at 4,096 tasks (``bench/views_scale.py``)."""
    t = type(x)
    if t is int:
        return True
    if t is float:
        return math.isfinite(x)
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _numbers_ok(rec: dict[str, Any], ranges: dict[str, tuple[float, float]]) -> bool:
    """Every known numeric field present is a finite number in the protocol's range (or null)."""
    get = rec.get
    for k, (lo, hi) in ranges.items():
        v = get(k)
        if v is None:
            continue
        t = type(v)
        if t is int or t is float:  # the usual case, without is_number's call
            if not (lo <= v <= hi and (t is int or math.isfinite(v))):
                return False
        elif not (is_number(v) and lo <= v <= hi):
            return False
    return True


def _clean_gpus(gpus: Any) -> list[dict[str, Any]] | None:
    if not isinstance(gpus, list):
        return None
    good = [g for g in gpus if isinstance(g, dict) and _numbers_ok(g, GPU_NUMERIC)]
    for g in good:
        if "throttle" in g and not (isinstance(g["throttle"], list) and all(isinstance(t, str) for t in g["throttle"])):
            g.pop("throttle")
        if "name" in g and not isinstance(g["name"], str):
            g.pop("name")
    return good


def clean_heartbeat(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The record as the views may use it, or None when its core fields are damaged."""
    if not isinstance(rec.get("task"), str):
        return None
    if rec.get("kind") == "profile":
        return rec if _numbers_ok(rec, PROFILE_NUMERIC) else None
    if not _numbers_ok(rec, HEARTBEAT_NUMERIC):
        return None
    prog = rec.get("progress")
    if prog is not None and not (
        isinstance(prog, dict) and _numbers_ok(prog, PROGRESS_NUMERIC) and isinstance(prog.get("phase", ""), str)
    ):
        rec.pop("progress")
    if rec.get("host") is not None and not (isinstance(rec["host"], dict) and _numbers_ok(rec["host"], HOST_NUMERIC)):
        rec.pop("host")
    if "gpus" in rec:
        rec["gpus"] = _clean_gpus(rec["gpus"])
    return rec


def heartbeat_records(path: Path) -> list[dict[str, Any]]:
    """The run's usable heartbeat and profile records, in file order. The cyclic collector is paused
    while they are parsed: they are acyclic dicts, and at 4,096 tasks (~190k records) its passes
    over the growing list cost a third of the parse (``bench/views_scale.py``)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return [r for r in map(clean_heartbeat, read_jsonl(path)) if r is not None]
    finally:
        if paused:
            gc.enable()


def event_records(path: Path) -> list[BaseEvent]:
    """The run's intact events, typed; a damaged line is skipped (``events.read``)."""
    return read_events(path)


def json_object(run: RunDir, path: Path) -> dict[str, Any]:
    """A JSON file of the run that should hold an object ({} when missing, unreadable or not one)."""
    data = run.read_json(path)
    return data if isinstance(data, dict) else {}
