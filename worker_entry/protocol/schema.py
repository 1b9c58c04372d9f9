"""Typed records validated on receipt, with the standard library only.

``Record.from_dict`` checks every declared field against its type hint (int, float, str, bool,
``X | None``, ``Literal``, ``list[X]``, ``dict[str, X]``, nested records) and its ``spec()`` range or
length, with validators compiled once per field (≈20 µs per heartbeat). Unknown keys are ignored (a
newer peer may send more); a missing, mistyped, out-of-range or oversized one raises one
``ProtocolError`` naming the field — whatever the value: every numeric field of the protocol names its
range (a 401-digit integer is out of range, not an ``OverflowError``), and anything else a check raises
becomes a ``ProtocolError`` too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from .frames import ProtocolError


def spec(
    *, lo: float | None = None, hi: float | None = None, max_len: int | None = None, value_len: int | None = None
) -> dict[str, Any]:
    """Field metadata: numeric range [lo, hi]; string/list/dict length limit; a dict's longest string value."""
    return {"lo": lo, "hi": hi, "max_len": max_len, "value_len": value_len}


STR = 4096  # default longest string field
LONG = 64 << 10  # long texts (reasons, errors)
_NONE = type(None)

# Ranges the protocol's numeric fields take (every one names its range: a peer's absurd number is a
# ProtocolError naming the field, never an OverflowError deep in the launcher's arithmetic).
COUNT_MAX = 1 << 53  # counters, steps, bytes: exact in a double, far beyond anything real (8 PiB)
TS_MAX = 1e11  # a Unix time (year 5138)
MS_MAX = 1e12  # a duration in milliseconds (31 years)
S_MAX = 1e9  # a duration in seconds
MB_MAX = 1 << 40  # memory in MiB (1 EiB)
ID_MAX = (1 << 31) - 1  # pids, thread and process counts
#: Unbounded declarations still get these (a record outside the protocol, e.g. an event read back).
_INT_LIMIT = (1 << 63) - 1
_FLOAT_LIMIT = 1e300
_INF = float("inf")
_STR_ONLY = {str}
#: each compiled plain-string check and its longest length (a list of them is checked in one pass)
_STR_LIMITS: dict[Callable[..., Any], int] = {}
_PLACES = 256  # field-name tables kept per record class


def _fail(path: str, expected: str, value: Any) -> ProtocolError:
    text = repr(value)
    return ProtocolError(f"{path}: expected {expected}, got {text[:60] + '...' if len(text) > 60 else text}", path)


Check = typing.Callable[[Any, str, int], Any]


def _compile(tp: Any, meta: dict[str, Any]) -> Check:
    """A validator for values of type ``tp`` (built once per field): returns the value or raises."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return lambda v, path, depth: v
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(tp)
        nullable = _NONE in args
        checks = [_compile(a, meta) for a in args if a is not _NONE]
        expected = " or ".join(_name(a) for a in args)
        if len(checks) == 1:  # ``X | None``: the protocol's every optional field, checked without a loop
            only = checks[0]

            def optional(v: Any, path: str, depth: int) -> Any:
                return None if v is None and nullable else only(v, path, depth)

            return optional

        def union(v: Any, path: str, depth: int) -> Any:
            if v is None and nullable:
                return None
            errors = []
            for check in checks:
                try:
                    return check(v, path, depth)
                except ProtocolError as exc:
                    errors.append(exc)
            raise errors[0] if len(errors) == 1 else _fail(path, expected, v)

        return union
    if origin is Literal:
        allowed = typing.get_args(tp)
        text = "one of " + ", ".join(map(repr, allowed))

        def literal(v: Any, path: str, depth: int) -> Any:
            if v not in allowed or isinstance(v, bool):
                raise _fail(path, text, v)
            return v

        return literal
    if origin in (list, tuple):
        item = _compile(typing.get_args(tp)[0], {})
        limit = meta.get("max_len") or 4096
        as_tuple = origin is tuple

        strings = _STR_LIMITS.get(item)  # a list of plain strings (a cluster's endpoints): checked at C speed

        def sequence(v: Any, path: str, depth: int) -> Any:
            if not isinstance(v, list):
                raise _fail(path, "a list", v)
            _length(v, path, limit)
            _depth(path, depth)
            if strings is not None and set(map(type, v)) <= _STR_ONLY and max(map(len, v), default=0) <= strings:
                return tuple(v) if as_tuple else list(v)
            try:  # each item's place is named only when one fails: a 16,384-task cluster is 16,384 items
                out = [item(x, path, depth + 1) for x in v]
            except ProtocolError:
                out = [item(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)]  # the same check: it raises, placed
            return tuple(out) if as_tuple else out

        return sequence
    if origin is dict:
        value_check = _compile(
            typing.get_args(tp)[1], {"max_len": meta.get("value_len"), "lo": meta.get("lo"), "hi": meta.get("hi")}
        )
        limit = meta.get("max_len") or 4096

        def mapping(v: Any, path: str, depth: int) -> Any:
            if not isinstance(v, dict):
                raise _fail(path, "a mapping", v)
            _length(v, path, limit)
            _depth(path, depth)
            out = {}
            for k, x in v.items():
                if not isinstance(k, str) or len(k) > STR:
                    raise _fail(path, "string keys", k)
                out[k] = value_check(x, f"{path}.{k}", depth + 1)
            return out

        return mapping
    if isinstance(tp, type) and issubclass(tp, Record):

        def record(v: Any, path: str, depth: int) -> Any:
            if not isinstance(v, dict):
                raise _fail(path, "a mapping", v)
            _depth(path, depth)
            return tp.from_dict(v, path, depth + 1)

        return record
    if tp is bool:

        def boolean(v: Any, path: str, depth: int) -> Any:
            if not isinstance(v, bool):
                raise _fail(path, "true or false", v)
            return v

        return boolean
    if tp is str:
        limit = meta.get("max_len") or STR

        def string(v: Any, path: str, depth: int) -> Any:
            if not isinstance(v, str):
                raise _fail(path, "a string", v)
            _length(v, path, limit)
            return v

        _STR_LIMITS[string] = limit
        return string
    if tp not in (int, float):  # pragma: no cover - a schema bug, not a peer's
        raise TypeError(f"unsupported field type {tp!r}")
    lo, hi = meta.get("lo"), meta.get("hi")
    span = f"a value in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    is_int = tp is int
    limit = _INT_LIMIT if is_int else _FLOAT_LIMIT
    low = -limit if lo is None else lo
    high = limit if hi is None else hi

    def number(v: Any, path: str, depth: int) -> Any:
        t = type(v)  # the usual value first: a float (or an int) in range; NaN and ±inf fail the range
        if ((t is float and not is_int) or t is int) and low <= v <= high:
            return v if t is float or is_int else float(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (is_int and not isinstance(v, int)):
            raise _fail(path, "an integer" if is_int else "a number", v)
        if isinstance(v, float) and (v != v or v in (_INF, -_INF)):
            raise _fail(path, "a number", v)
        # Compared before any conversion: float() of a 401-digit int raises OverflowError.
        if not (low <= v <= high):
            raise _fail(
                path, span if lo is not None or hi is not None else f"a finite {_name(tp)} of at most {limit:g}", v
            )
        return v if is_int else float(v)

    return number


def _depth(path: str, depth: int) -> None:
    if depth > 16:
        raise ProtocolError(f"{path}: nested too deeply", path)


def _length(value: Any, path: str, limit: int) -> None:
    if len(value) > limit:
        raise ProtocolError(f"{path}: too long ({len(value)} > {limit})", path)


def _name(tp: Any) -> str:
    return "null" if tp is _NONE else getattr(tp, "__name__", str(tp))


class Record:
    """A dataclass whose ``from_dict`` validates every declared field (see ``_check``)."""

    @classmethod
    def _validators(cls) -> list[tuple[str, bool, Check]]:
        compiled = cls.__dict__.get("_compiled")
        if compiled is None:
            hints = typing.get_type_hints(cls)
            compiled = [
                (
                    f.name,
                    f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                    _compile(hints[f.name], dict(f.metadata)),
                )
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            ]
            cls._compiled = compiled  # type: ignore[attr-defined]
        return compiled

    @classmethod
    def _fields_at(cls, path: str) -> list[tuple[str, bool, Check, str]]:
        """The validators with each field's full name under ``path`` (``progress.steps``): built once per
        place a record appears, not per field per message. The places are the schema's own (a list's
        index is bounded by its length); past ``_PLACES`` of them the names are built each time."""
        places = cls.__dict__.get("_places")
        if places is None:
            places = cls._places = {}  # type: ignore[attr-defined]
        fields = places.get(path)
        if fields is None:
            fields = [(n, r, c, f"{path}.{n}" if path else n) for n, r, c in cls._validators()]
            if len(places) < _PLACES:
                places[path] = fields
        return fields

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "", depth: int = 0) -> Any:
        """The record, every declared field checked; a ProtocolError naming the first bad one. The
        usual record (every value of its field's exact type, in range) is read by the class's
        generated reader (``_fast_reader``); anything else by the checks (``_checked``), which decide."""
        fast = cls.__dict__.get("_fast")
        if fast is None:
            fast = cls._fast = _fast_reader(cls)  # type: ignore[attr-defined]
        out = fast(data, path, depth)
        return out if out is not _SLOW else cls._checked(data, path, depth)

    @classmethod
    def _checked(cls, data: dict[str, Any], path: str, depth: int) -> Any:
        kwargs = {}
        for name, required, check, where in cls._fields_at(path):
            if name not in data:
                if required:
                    raise ProtocolError(f"{where}: required field is missing", where)
                continue
            try:
                kwargs[name] = check(data[name], where, depth)
            except ProtocolError:
                raise
            except (ArithmeticError, TypeError, ValueError, RecursionError) as exc:  # whatever a peer sends
                raise ProtocolError(f"{where}: invalid value ({type(exc).__name__})", where) from None
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """What ``dataclasses.asdict`` gives, at a fraction of its cost (no deepcopy of plain values; one
        generated function per class, ``_writer``, no loop): the launcher turns every heartbeat into a record."""
        write = type(self).__dict__.get("_write")
        if write is None:
            write = type(self)._write = _writer(type(self))  # type: ignore[attr-defined]
        return write(self)


def _writer(cls: type) -> Callable[[Any], dict[str, Any]]:
    """``to_dict`` of ``cls``: each field read once, a plain value (``_SCALARS``) kept as is, anything
    else through ``_plain`` — what the loop over the fields did, without the loop."""
    names = [f.name for f in dataclasses.fields(cls)]
    if not names:
        return lambda o: {}
    ns: dict[str, Any] = {"S": _SCALARS, "plain": _plain}
    reads = "; ".join(f"v{i} = o.{n}" for i, n in enumerate(names))
    items = ", ".join(f"{n!r}: v{i} if type(v{i}) in S else plain(v{i})" for i, n in enumerate(names))
    exec(f"def write(o):\n {reads}\n return {{{items}}}", ns)  # built from the class's own field names
    return ns["write"]


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _plain(v: Any) -> Any:
    if type(v) in _SCALARS:
        return v
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        if v and type(v[0]) in _SCALARS:  # a list of plain values (a cluster's endpoints): copied in C
            return type(v)(v)
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


_SLOW = object()  # a generated reader's answer for a record it leaves to the checks


def _fast_reader(cls: type[Record]) -> Check:
    """A reader of ``cls`` made for the usual record, generated once per class: one function whose
    lines test each field inline — present or not, ``None`` where allowed, its exact JSON type
    (``int``, ``float``, ``str``, ``bool``; an ``int`` for a float field becomes a float, as the check
    does), its range or length, nested records by their own readers — without a call per field. It
    accepts only what the checks accept, with the same value; any other value, a missing required
    field, or anything that raises returns ``_SLOW``, and the checks read the record again: the outcome,
    and the error a node's bad record gets, are theirs. Lists, mappings, literals and unions are the
    checks' own, called from here. A heartbeat 1.2x, a step-clock window 1.7x cheaper (docs/benchmarks.md §11)."""
    hints = typing.get_type_hints(cls)
    ns: dict[str, Any] = {"SLOW": _SLOW, "cls": cls, "fields_at": cls._fields_at}
    body = ["def fast(data, path, depth):", " try:", "  kw = {}"]
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        tp = hints[f.name]
        args = typing.get_args(tp)
        nullable = typing.get_origin(tp) in (Union, types.UnionType) and _NONE in args
        inner = [a for a in args if a is not _NONE] if nullable else [tp]
        ns[f"K{i}"] = f.name
        body += [f"  if K{i} in data:", f"   v = data[K{i}]"]
        if nullable:
            body.append("   if v is None: pass")
        body.append(("   elif " if nullable else "   if ") + _fast_test(inner, dict(f.metadata), i, ns))
        body += ["   else: return SLOW", f"   kw[K{i}] = v"]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            body.append("  else: return SLOW")
    body += ["  return cls(**kw)", " except Exception:", "  return SLOW"]
    exec("\n".join(body), ns)  # built above from the class's own declarations, nothing else
    return ns["fast"]


def _fast_test(inner: list[Any], meta: dict[str, Any], i: int, ns: dict[str, Any]) -> str:
    """The condition under which field ``i``'s value ``v`` is read inline (and ``v``'s conversion)."""
    tp = inner[0] if len(inner) == 1 else None
    if tp in (int, float):
        limit = _INT_LIMIT if tp is int else _FLOAT_LIMIT
        lo, hi = meta.get("lo"), meta.get("hi")
        ns[f"L{i}"], ns[f"H{i}"] = -limit if lo is None else lo, limit if hi is None else hi
        if tp is int:
            return f"type(v) is int and L{i} <= v <= H{i}: pass"
        return f"(type(v) is float or type(v) is int) and L{i} <= v <= H{i}: v = float(v)"
    if tp is str:
        ns[f"N{i}"] = meta.get("max_len") or STR
        return f"type(v) is str and len(v) <= N{i}: pass"
    if tp is bool:
        return "type(v) is bool: pass"
    if isinstance(tp, type) and issubclass(tp, Record):
        ns[f"R{i}"] = tp
        return f"type(v) is dict and depth <= 16: v = R{i}.from_dict(v, path + '.' + K{i} if path else K{i}, depth + 1)"
    # Any, lists, mappings, literals, unions: the field's own check (it names the field if the value is wrong)
    return f"True: v = fields_at(path)[{i}][2](v, fields_at(path)[{i}][3], depth)"
