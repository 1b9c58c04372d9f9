"""A large .jsonl file's objects, parsed many lines per call of the JSON decoder.

``report`` at 4,096 tasks reads ~190k heartbeat records (81 MB); one ``json.loads`` per line spends a
fifth of the parse outside the decoder's C scanner (the call, the encoding detection, the exception
guard), and every record gets its own copies of the same keys. A block of whole lines joined into one
JSON array is decoded in one call (the scanner's key memo is then shared by the block's records):
measured 2.8 → 2.25 s of CPU over run4096's heartbeats.jsonl (``bench/views_scale.py``).

The result is the per-line reading's: a block is taken whole only when it decodes as an array of
exactly one object per line; anything else in it (a torn line, a blank line, a line that is not an
object, bytes that are not UTF-8) sends that block back to one ``json.loads`` per line, which skips
what does not parse. The newline stays beside each inserted comma, so no JSON string can span two
lines (the decoder refuses a raw newline in a string). A crafted file could still make two lines
that are each invalid decode as one object while another line holds two; the records are validated
after reading in any case (``views.records``), so such a file gains nothing it could not write plainly.

Where orjson is installed (optional: the launcher and the views run without it) a block is decoded by
it first: 2.5 → 1.5 s of CPU over run4096's 81 MB. Only where its answer is the standard decoder's: it
refuses what ``json`` would read differently (NaN, Infinity, 1e400, a lone surrogate, a BOM), and a
block holding an integer of 19 digits or more (one orjson might turn into a float) is left to
``json``; a refusal sends the block down the standard path, so the objects are the same either way
(one exception: a line nested ~1,000 deep, past the interpreter's recursion limit for ``json`` but
within orjson's 1,024, is an object to orjson; no field the views validate is nested so deep).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ..core.fastjson import ORJSON as _orjson  # optional (see above): json is the reference

#: Bytes of whole lines decoded per call: large enough that the call's cost vanishes, small enough that
#: a damaged block re-read line by line costs little and the text copy stays a few MB.
BLOCK = 4 << 20

#: A line longer than this is no record (a heartbeats.jsonl record is ~0.5 KB, the largest event of a
#: 16,384-task job a few MB): skipped, never held whole.
MAX_LINE = 64 << 20

#: An integer past 64 bits, which orjson reads as a float where ``json`` keeps an int, is a run of 19
#: digits or more after anything but a digit or a point: found with one ``translate`` and one ``find``
#: (a regular expression costs a third of what orjson saves). Digits become "0", the characters of a
#: number's fraction or exponent ".", anything else " ".
_SHAPE = bytes((48 if 48 <= b <= 57 else 46 if b in b".eE" else 32) for b in range(256))
_LONG_INT = b" " + b"0" * 19


def per_line(lines: Iterable[bytes | str]) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``lines`` (a file, or what a ``Tail`` yields); anything else is skipped."""
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            continue
        if isinstance(rec, dict):
            yield rec


def _block(data: bytes) -> list[Any] | None:
    """The objects of ``data`` (whole lines, the last one without its newline) decoded as one array, or
    None when that is not exactly one object per line."""
    out = _fast(data)
    if out is None:
        try:
            text = data.decode("utf-8")
            out = json.loads("[" + text.replace("\n", "\n,") + "]")
        except (ValueError, RecursionError):
            return None
    if len(out) != data.count(b"\n") + 1:
        return None
    dict_ = dict
    for rec in out:
        if type(rec) is not dict_:
            return None
    return out


def _fast(data: bytes) -> list[Any] | None:
    """The block as orjson decodes it, or None where it is absent, refuses it, or might differ."""
    if _orjson is None or (b" " + data).translate(_SHAPE).find(_LONG_INT) >= 0:
        return None
    try:
        return _orjson.loads(b"[" + data.replace(b"\n", b"\n,") + b"]")
    except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
        return None


def objects(f: IO[bytes], block: int = BLOCK, max_line: int = MAX_LINE) -> Iterator[dict[str, Any]]:
    """The JSON objects of an open binary .jsonl file, in file order, as ``per_line`` reads them. A line
    longer than ``max_line`` is no record (a crash's NUL-filled tail, a planted file): skipped up to its
    end, never held whole (the text before a newline was joined again at every block: 59 s and 1.2 GB
    for 600 MB without one)."""
    pending: list[bytes] = []  # the start of a line no block has ended yet
    size = 0
    skipping = False  # inside a line past ``max_line``: dropped up to its newline
    while True:
        chunk = f.read(block)
        if not chunk:
            if pending and not skipping:
                yield from per_line(b"".join(pending).split(b"\n"))
            return
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            chunk, skipping = chunk[nl + 1 :], False
        cut = chunk.rfind(b"\n")
        if cut < 0:
            pending.append(chunk)
            size += len(chunk)
            if size > max_line:
                pending, size, skipping = [], 0, True
            continue
        pending.append(chunk[:cut])
        body = b"".join(pending)
        pending = [chunk[cut + 1 :]]
        size = len(pending[0])
        got = _block(body)
        if got is None:
            yield from per_line(body.split(b"\n"))
        else:
            yield from got
