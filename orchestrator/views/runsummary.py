"""RUN/summary.json: the run's whole-run report, built once at the run's end, so that ``report`` of a
4,096-task run reads one small file instead of ~190k heartbeat records (~9 s of CPU: docs/benchmarks.md §11).

What it holds is exactly what ``report`` (without ``--last``) builds: the ``Report`` itself, every
dataclass of it field by field (not ``to_dict``, which is the ``--json`` shape and drops types), and
the step-time series of the page's picture. It is a file in the run directory, so it is never
trusted: it is used only when its version is this code's, when it names the size and SHA-256 of every
file the report is built from (heartbeats.jsonl, events.jsonl, plan.json, result.json: a run that
went on, a file edited or replaced, and the summary is stale) and when every field decodes to the
type the model declares. Anything else, and ``report`` reads the records as it always did: a missing,
stale, damaged or hostile summary costs time, never a wrong report or a traceback. Written by the
command that ran the job (``cli.commands.after_run``), atomically; a summary that fails to be written
is a warning.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runs import RunDir, write_bytes_atomic
from .reportmodel import Report

#: This code's summary; another version is read as absent.
VERSION = 1
#: A summary larger than this is refused unread (a 16,384-task run's is a few tens of MB).
MAX_BYTES = 512 << 20

Series = dict[str, list[tuple[float, float]]]


class SummaryError(ValueError):
    """The summary is not one this code wrote for these files."""


@dataclass(frozen=True)
class RunSummary:
    """What ``report`` needs of a run: its report and its page's step-time series."""

    report: Report
    series: Series


def summarise(run: RunDir, records: list[dict[str, Any]] | None = None) -> Path:
    """Build the run's report and page series from its records (once, at the run's end) and write them.
    ``records``: the run's heartbeat records when the caller read them (its TensorBoard end uses them)."""
    from .pages import step_series
    from .records import heartbeat_records
    from .report import build_report

    records = heartbeat_records(run.heartbeats_jsonl) if records is None else records
    return write_summary(run, RunSummary(build_report(run, records=records), step_series(run, records)))


def write_summary(run: RunDir, summary: RunSummary) -> Path:
    """RUN/summary.json for these files, atomically."""
    doc = {
        "version": VERSION,
        "sources": run.report_sources(),
        "report": encode(summary.report),
        "series": {t: [[ts, v] for ts, v in pts] for t, pts in summary.series.items()},
    }
    path = run.summary_json
    write_bytes_atomic(path, json.dumps(doc, separators=(",", ":"), allow_nan=True).encode(), durable=False)
    return path


def read_summary(run: RunDir) -> RunSummary | None:
    """The run's summary when it is this code's and matches the run's files now; None otherwise."""
    try:  # not through a planted link, and a FIFO neither blocks the open nor is read
        fd = os.open(run.summary_json, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            return None
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("sources") != run.report_sources():
            return None
        report = decode(Report, doc.get("report"), "report")
        series = _series(doc.get("series"))
    except (OSError, ValueError, TypeError, RecursionError):  # SummaryError and JSON errors are ValueErrors
        return None
    return RunSummary(dataclasses.replace(report, run_dir=str(run.path)), series)


def _series(data: Any) -> Series:
    if not isinstance(data, dict):
        raise SummaryError("series: not an object")
    out: Series = {}
    for task, pts in data.items():
        if not isinstance(pts, list):
            raise SummaryError(f"series.{task}: not a list")
        out[task] = [(_num(p, 0), _num(p, 1)) for p in pts]
    return out


def _num(p: Any, i: int) -> float:
    if not (isinstance(p, list) and len(p) == 2 and type(p[i]) in (int, float)):
        raise SummaryError("series: a point is not [ts, ms]")
    return float(p[i])


def encode(obj: Any) -> Any:
    """A model as JSON data, every dataclass field by field (the decoder knows the types)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {_key(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode(x) for x in obj]
    return obj


def _key(k: Any) -> str:
    if not isinstance(k, str):
        raise SummaryError(f"a key that is not a string: {k!r}")
    return k


def decode(tp: Any, data: Any, where: str) -> Any:
    """``data`` as the type ``tp`` (the model's declared field types), or SummaryError naming ``where``."""
    try:
        return _decoder(tp)(data)
    except SummaryError as exc:
        raise SummaryError(f"{where}: {exc}") from None


_DECODERS: dict[Any, Any] = {}


def _decoder(tp: Any) -> Any:
    """One function per declared type, made once: a 4,096-worker report has ~100k fields to check."""
    key = tp
    fn = _DECODERS.get(key)
    if fn is None:
        fn = _DECODERS[key] = _make(tp)
    return fn


def _fail(what: str) -> Any:
    raise SummaryError(what)


def _make(tp: Any) -> Any:
    if tp is Any:
        return lambda d: d
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, vars(sys.modules[tp.__module__]))
        fields = [(f.name, hints[f.name]) for f in dataclasses.fields(tp)]
        names = {n for n, _ in fields}
        cls = tp

        def dc(d: Any) -> Any:
            if type(d) is not dict or d.keys() != names:
                _fail(f"not a {cls.__name__}")
            return cls(**{n: _decoder(t)(d[n]) for n, t in fields})

        return dc
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in args if a is not type(None)]  # the model's unions are X | None
        sub = _decoder(inner)
        return lambda d: None if d is None else sub(d)
    if origin in (tuple, list):
        item = _decoder(args[0] if args else Any)
        if origin is tuple:
            return lambda d: tuple(map(item, d)) if type(d) is list else _fail("not a list")
        return lambda d: list(map(item, d)) if type(d) is list else _fail("not a list")
    if origin in (dict, Mapping) or tp is dict:
        value = _decoder(args[1] if args else Any)
        return lambda d: {k: value(v) for k, v in d.items()} if type(d) is dict else _fail("not an object")
    if tp is float:
        return lambda d: d if type(d) in (int, float) else _fail("not a number")
    if tp in (int, str, bool):
        return lambda d: d if type(d) is tp else _fail(f"not a {tp.__name__}")
    raise SummaryError(f"a type the summary does not hold ({tp!r})")
