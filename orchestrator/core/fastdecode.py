"""The launcher's reader of the messages it records (heartbeats, step-clock windows): msgspec, in C.

Why: at 4,096 tasks reading a node's message was 22 % of the launcher's CPU (orjson's dict, then the
generated readers of ``protocol.plainread``, ~25 µs a heartbeat; issue 33). msgspec decodes and checks
the payload against typed structs in one pass in C; what is left in Python is building the message
and its record from them.

One owner per fact: the structs are generated once from the protocol's own dataclass declarations
(types, ``spec`` ranges and lengths, defaults), never written by hand. And nothing unverified is
trusted: this reader only ever *accepts*, and only what the protocol's checks accept, with the same
values; everything else (msgspec refuses, or the payload is one whose reading could differ) answers
None, and ``protocol.parse`` reads the payload by the rules that decide (same outcome, same error):

- Ranges and lengths are the declarations' (``Meta(ge, le, max_length)``); an int is never a bool
  nor a float (msgspec's strict mode), an int for a float field becomes that float. A float field's
  bounds are kept within ±(2**53 - 1): there an int's conversion to float is exact, so a huge integer
  that rounds onto a bound is never let through (the checks compare the integer itself).
- Unknown keys are ignored as ``from_dict`` ignores them; a repeated key is its last value, as in
  ``json`` (msgspec checks every occurrence: an invalid earlier one is refused here, read there).
- msgspec skips an unknown key's value without checking its UTF-8, which ``json`` refuses: a payload
  that is not ASCII is read here only if it is valid UTF-8. NaN/Infinity tokens and lone surrogates
  msgspec refuses. A payload with many brackets goes to ``json`` as ``fastjson.loads`` sends it there
  (it decides how deep is too deep).
- The record is ``to_dict``'s: every field in declaration order, defaults filled, nested records as
  dicts with all their fields, the message's own None fields dropped (``plainread``'s ``drop_none``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional, Union

from worker_entry.protocol import messages
from worker_entry.protocol.schema import _FLOAT_LIMIT, _INT_LIMIT, _SCALARS, STR, Record

from .fastjson import _NESTING

try:  # optional, like orjson: without it the launcher reads as before (protocol.plainread)
    import msgspec
except ImportError:  # pragma: no cover - exercised by tests that inject None
    msgspec = None

#: Payload → (message, record), or None: ``protocol.parse``'s ``read``.
Reader = Callable[[bytes], tuple[Any, dict[str, Any]] | None]
#: The largest magnitude whose int → float conversion is exact (a float field's bounds stay within it).
_EXACT = float((1 << 53) - 1)
_NONE = type(None)


class Unsupported(Exception):
    """A declaration this generator does not translate: that class is read by the protocol's path."""


def _struct_type(tp: Any, meta: dict[str, Any], owner: type, made: dict[type, Any]) -> Any:
    """The msgspec type of a field declared ``tp`` with ``spec`` metadata ``meta`` (``schema._compile``'s
    rules, as constraints)."""
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if len(args) != 2 or _NONE not in args:
            raise Unsupported(f"{owner.__name__}: union {tp!r}")
        (inner,) = (a for a in args if a is not _NONE)
        return Optional[_struct_type(inner, meta, owner, made)]  # noqa: UP045 - a runtime type, built
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not all(type(a) is str for a in allowed):
            raise Unsupported(f"{owner.__name__}: literal {tp!r}")
        return Literal[allowed]
    if origin is list:
        item = _struct_type(typing.get_args(tp)[0], {}, owner, made)
        return Annotated[list[item], msgspec.Meta(max_length=meta.get("max_len") or 4096)]  # type: ignore[valid-type]
    if isinstance(tp, type) and issubclass(tp, Record):
        if tp is owner or (tp in made and made[tp] is None):
            raise Unsupported(f"{owner.__name__}: a record nested in itself")
        return _struct(tp, made)
    if tp is bool:
        return bool
    if tp is str:
        return Annotated[str, msgspec.Meta(max_length=meta.get("max_len") or STR)]
    lo, hi = meta.get("lo"), meta.get("hi")
    if tp is int:  # for an int v: v >= lo iff v >= ceil(lo), v <= hi iff v <= floor(hi), exactly
        low, high = -_INT_LIMIT if lo is None else math.ceil(lo), _INT_LIMIT if hi is None else math.floor(hi)
        return Annotated[int, msgspec.Meta(ge=low, le=high)]
    if tp is float:
        low = max(-_FLOAT_LIMIT if lo is None else lo, -_EXACT)
        high = min(_FLOAT_LIMIT if hi is None else hi, _EXACT)
        return Annotated[float, msgspec.Meta(ge=float(low), le=float(high))]
    raise Unsupported(f"{owner.__name__}: {tp!r}")


def _struct(cls: type[Record], made: dict[type, Any], tag: str | None = None) -> Any:
    """The msgspec struct of a record class, generated from its dataclass declaration (once: ``made``)."""
    if made.get(cls) is not None:
        return made[cls]
    made[cls] = None  # being made: a class nested in itself is refused above
    if "__post_init__" in vars(cls):
        raise Unsupported(f"{cls.__name__}: checks of its own (__post_init__)")
    hints = typing.get_type_hints(cls)
    fields: list[tuple[Any, ...]] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only or f.name == "type":
            raise Unsupported(f"{cls.__name__}.{f.name}: not a plain positional field")
        tp = _struct_type(hints[f.name], dict(f.metadata), cls, made)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            fields.append((f.name, tp))
        elif f.default_factory is dataclasses.MISSING and type(f.default) in _SCALARS:
            fields.append((f.name, tp, f.default))
        else:
            raise Unsupported(f"{cls.__name__}.{f.name}: a default that is not a plain value")
    # a message (tagged) leaves out its fields at their default (None, and a few more: see ``reader``)
    struct = msgspec.defstruct(
        f"{cls.__name__}Struct",
        fields,
        tag_field="type" if tag else None,
        tag=tag,
        omit_defaults=tag is not None,
        module=__name__,
    )
    made[cls] = struct
    return struct


def _builder(cls: type[Record], built: dict[type, Any]) -> Callable[[Any], Any]:
    """``struct -> record`` of ``cls``: the instance ``cls(**fields)`` makes, its nested records built by
    their own builders (what ``msgspec.convert(from_attributes=True)`` does, at 2/3 of its cost: the
    fields in declaration order, as the dataclass's ``__init__`` sets them; no ``__post_init__``, which
    ``_struct`` refuses)."""
    if cls in built:
        return built[cls]  # type: ignore[no-any-return]
    nested: list[tuple[str, bool, Callable[[Any], Any]]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = hints[f.name]
        args = (
            [a for a in typing.get_args(tp) if a is not _NONE]
            if typing.get_origin(tp) in (Union, types.UnionType)
            else [tp]
        )
        many = typing.get_origin(args[0]) is list
        one = typing.get_args(args[0])[0] if many else args[0]
        if isinstance(one, type) and issubclass(one, Record):
            nested.append((f.name, many, _builder(one, built)))
    # one generated function per class, no loop over its nested fields (as plainread's readers): 1.15x
    ns: dict[str, Any] = {"asdict": msgspec.structs.asdict, "new": object.__new__, "cls": cls}
    body = ["def build(struct):", " fields = asdict(struct)"]
    for i, (name, many, inner) in enumerate(nested):
        ns[f"B{i}"] = inner
        made = f"[B{i}(x) for x in v]" if many else f"B{i}(v)"
        body += [f" v = fields[{name!r}]", f" if v is not None: fields[{name!r}] = {made}"]
    body += [" record = new(cls)", " record.__dict__ = fields", " return record"]
    exec("\n".join(body), ns)  # built from the class's own field names, nothing else
    build: Callable[[Any], Any] = ns["build"]
    built[cls] = build
    return build


def reader(classes: frozenset[type[messages.Message]] = messages.RECORDED) -> Reader | None:
    """``protocol.parse``'s ``read`` for ``classes`` (those the generator translates), or None without
    msgspec. It answers ``(message, record)`` — the message as ``from_dict`` reads it, its record as
    ``plainread.read_plain(drop_none=True)`` builds it — or None: the protocol's path decides."""
    if msgspec is None:
        return None
    made: dict[type, Any] = {}
    built: dict[type, Any] = {}
    #: per message struct: its builder, and the fields whose default is not None (its record keeps them)
    builders: dict[Any, tuple[Callable[[Any], Any], frozenset[str]]] = {}
    for cls in sorted(classes, key=lambda c: c.TYPE):
        try:
            kept = frozenset(f.name for f in dataclasses.fields(cls) if f.default is not None)  # type: ignore[arg-type]
            builders[_struct(cls, made, cls.TYPE)] = _builder(cls, built), kept
        except Unsupported:
            continue  # read as before
    if not builders:
        return None
    decode = msgspec.json.Decoder(Union[tuple(builders)]).decode  # type: ignore[valid-type]  # noqa: UP007
    to_builtins, to_dict = msgspec.to_builtins, Record.to_dict

    def read(payload: bytes) -> tuple[Any, dict[str, Any]] | None:
        if type(payload) is not bytes:
            return None
        # nested as deep as json refuses? JSON that decodes nests at most len/2 deep: short ones uncounted
        if len(payload) >= 2 * _NESTING and payload.count(b"[") + payload.count(b"{") >= _NESTING:
            return None
        if not payload.isascii():
            try:
                payload.decode()  # what msgspec leaves unchecked in a skipped value, json refuses
            except UnicodeDecodeError:
                return None
        try:
            struct = decode(payload)
        except Exception:  # msgspec refused it: the protocol's path decides
            return None
        build, kept = builders[type(struct)]
        msg = build(struct)
        # The record in declaration order, nested records whole (their own lists and dicts: nothing shared
        # with the message), the message's fields at their default left out: a None, as the record drops
        # it; but also one that is not None (msgspec's test is identity), which the record keeps: then
        # it is converted back from the message, as ``record_of`` did before ``plainread``.
        plain = to_builtins(struct)
        del plain["type"]
        if plain.keys() >= kept:
            return msg, plain
        return msg, {k: v for k, v in to_dict(msg).items() if v is not None}

    return read


#: The launcher's reader of recorded messages (None without msgspec: ``protocol.plainread`` reads them).
READ: Reader | None = reader()
