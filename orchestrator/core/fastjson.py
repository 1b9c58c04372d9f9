"""JSON in the launcher's per-message path: orjson where it is installed, the standard library otherwise.

Why: at 1,024 tasks the launcher encodes ~1,200 heartbeats.jsonl records and a status.json of every
task each second, and decodes every message a node sends. ``json.dumps`` with any option builds a new
encoder per call (~16 µs for a heartbeat record, against ~2 µs with orjson); ``json.loads`` of a
heartbeat ~10 µs against ~2 µs (docs/benchmarks.md §11, issue 33.4). The launcher only: worker_entry
stays standard-library (its nodes import nothing that is not there).

Same outcome either way, by construction:

- ``loads``: orjson's answer where orjson accepts the text; anything it refuses (NaN, 1e400, lone
  surrogates, a byte-order mark) is handed to ``json.loads``, which decides; so is a text with more
  than ``_NESTING`` brackets (orjson reads deeper nesting than ``json`` can).
  One difference is left: orjson reads an integer past 64 bits as a float, where ``json`` keeps an
  int. A node's message is therefore read again by the standard library whenever its validation fails
  (``protocol.parse(loads=...)``): what is accepted, and the error a bad payload gets, are as before.
- ``dumps``: compact, like ``separators=(",", ":")``, non-ASCII as UTF-8 (``ensure_ascii`` off: the
  readers are JSON decoders, and a string's value is unchanged); anything orjson cannot encode (an integer past 64
  bits) goes through the standard library. A non-string key is written as its ``str``, dataclasses
  and datetimes as ``str`` of them (``default``), as ``json.dumps(..., default=str)`` does. Two
  spellings differ, neither reachable from what is written: a float NaN or infinity is ``null``
  (standard JSON; ``json`` writes ``NaN``, which other readers refuse; a heartbeats.jsonl record is
  validated, every float in its range, and status.json's figures are computed from such records),
  and an ``Enum`` that is not a ``str``/``int`` one would be its value (none is written: ``.value``).
"""

from __future__ import annotations

import json
from typing import Any

try:  # the launcher's only optional speed-up; pyproject lists it, but a missing one is no error
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by tests that hide the module
    _orjson = None

#: The orjson module, or None: the one place the launcher imports it (``runs.jsonl`` decodes blocks with
#: its own guards, since a block's refusal falls back to line-by-line reading, not to one ``json.loads``).
ORJSON: Any = _orjson

#: Past this many brackets a text may nest deeper than ``json`` (Python's recursion limit) can read,
#: where orjson reads on: the standard library takes it, and refuses it as before. A message has ~20.
_NESTING = 200
_OPEN: dict[type, tuple[Any, Any]] = {bytes: (b"[", b"{"), bytearray: (b"[", b"{"), str: ("[", "{")}
_ENCODE = json.JSONEncoder(separators=(",", ":"), default=str).encode  # one encoder, not one per call
# keys that are not strings written as ``str`` of them; dataclasses and datetimes handed to ``default``
# (``str``), as ``json.dumps(default=str)`` does, not orjson's own spelling of them
_OPTIONS = (
    0
    if _orjson is None
    else _orjson.OPT_NON_STR_KEYS | _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_DATETIME
)


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``'s value, or its exception."""
    if _orjson is not None and (data.count(_OPEN[type(data)][0]) + data.count(_OPEN[type(data)][1]) < _NESTING):
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides: the same acceptance and the same message as before
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON (UTF-8 bytes); ``str`` of what JSON has no type for."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj, default=str, option=_OPTIONS)
        except TypeError:
            pass  # an integer past 64 bits, say: the standard library's spelling
    return _ENCODE(obj).encode("utf-8", "surrogatepass")
