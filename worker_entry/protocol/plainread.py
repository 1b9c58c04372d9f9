"""The generated reader of ``read_plain``: a record and its ``to_dict()`` in one pass.

The launcher writes every heartbeat and step-clock window a node sends to heartbeats.jsonl, as the
message's plain dict; converting the validated record back (``to_dict``) cost as much again as a
third of reading it (issue 33.4). This reader builds both as it checks each field, with the same
tests as ``schema._fast_reader``; whatever it is not sure of goes to ``from_dict``, which decides.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from .schema import _FLOAT_LIMIT, _INT_LIMIT, _NONE, _SCALARS, _SLOW, STR, Check, Record, _fast_test, _plain


def read_plain(cls: type[Record], data: dict[str, Any], path: str = "", depth: int = 0, drop_none: bool = False) -> Any:
    """``(record, plain)``: the record as ``cls.from_dict`` reads it (the same checks, the same errors)
    and ``plain`` = ``Record.to_dict(record)`` (``drop_none``: without its fields that are None), built
    in the same pass by a reader generated once per class (``plain_reader``) instead of converted back
    afterwards."""
    key = "_plain_read_drop" if drop_none else "_plain_read"
    read = cls.__dict__.get(key)
    if read is None:
        read = plain_reader(cls, drop_none)
        setattr(cls, key, read)
    out = read(data, path, depth)
    if out is not _SLOW:
        return out
    record = cls.from_dict(data, path, depth)  # the checks decide (and raise for a bad record)
    plain = Record.to_dict(record)
    return record, {k: v for k, v in plain.items() if v is not None} if drop_none else plain


def plain_reader(cls: type[Record], drop_none: bool) -> Check:
    """``read_plain``'s generated reader: ``_fast_reader``'s tests, with each field's name, range and
    length written into the code as constants, and each field's plain value (what ``to_dict`` gives:
    nested records as their plain dicts, by their own generated readers; a missing field as its default)
    put in a second dict in declaration order — ``to_dict``'s order — as it is read. Anything else
    (any exception, a nested reader's ``_SLOW`` included) answers ``_SLOW``: ``read_plain`` then reads
    by ``from_dict``. A class with a default that is not a plain value (a ``default_factory``) gets a
    reader that always answers ``_SLOW``."""
    hints = typing.get_type_hints(cls)
    ns: dict[str, Any] = {"SLOW": _SLOW, "cls": cls, "fields_at": cls._fields_at, "S": _SCALARS, "plain": _plain}
    body = ["def read(data, path, depth):", " try:", "  d = {}"]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(not f.init or f.kw_only for f in fields):  # the record is made positionally below
        return lambda data, path, depth: _SLOW
    for i, f in enumerate(fields):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if not required and type(f.default) not in _SCALARS:
            return lambda data, path, depth: _SLOW
        tp, meta, k = hints[f.name], dict(f.metadata), repr(f.name)
        args = typing.get_args(tp)
        nullable = typing.get_origin(tp) in (Union, types.UnionType) and _NONE in args
        inner = [a for a in args if a is not _NONE] if nullable else [tp]
        one = inner[0] if len(inner) == 1 else None
        body += [f"  if {k} in data:", f"   v = data[{k}]"]
        if nullable:
            body.append("   if v is None: q = None")
        if one in (int, float):
            limit = _INT_LIMIT if one is int else _FLOAT_LIMIT
            lo, hi = meta.get("lo"), meta.get("hi")
            span = f"{-limit if lo is None else lo!r} <= v <= {limit if hi is None else hi!r}"
            test = f"type(v) is int and {span}: q = v"
            if one is float:
                test = f"type(v) is float and {span}: q = v\n   elif type(v) is int and {span}: v = q = float(v)"
        elif one is str:
            test = f"type(v) is str and len(v) <= {meta.get('max_len') or STR!r}: q = v"
        elif one is bool:
            test = "type(v) is bool: q = v"
        elif isinstance(one, type) and issubclass(one, Record) and one is not cls:  # its own plain reader
            ns[f"R{i}"] = one.__dict__.get("_plain_read") or plain_reader(one, False)
            one._plain_read = ns[f"R{i}"]  # type: ignore[attr-defined]
            test = f"type(v) is dict and depth <= 16: v, q = R{i}(v, path + '.' + {k} if path else {k}, depth + 1)"
        else:  # lists, mappings, literals, unions: the field's own check
            ns[f"K{i}"] = f.name
            test = _fast_test(inner, meta, i, ns) + "; q = v if type(v) in S else plain(v)"
        body.append(("   elif " if nullable else "   if ") + test)
        body += ["   else: return SLOW", f"   a{i} = v"]
        body.append(f"   if q is not None: d[{k}] = q" if drop_none else f"   d[{k}] = q")
        if required:
            body.append("  else: return SLOW")
        elif drop_none and f.default is None:
            body.append(f"  else: a{i} = None")
        else:
            body.append(f"  else: a{i} = d[{k}] = {f.default!r}")
    args = ", ".join(f"a{i}" for i in range(len(fields)))
    body += [f"  return cls({args}), d", " except Exception:", "  return SLOW"]
    exec("\n".join(body), ns)  # built above from the class's own declarations, nothing else
    return ns["read"]
