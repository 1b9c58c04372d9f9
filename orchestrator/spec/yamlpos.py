"""YAML loading that remembers the line of every key and value and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys (`port: 22` ... `port: 2222`), which turns a typo
into a wrong cluster. We construct mappings ourselves to catch that and to point errors at lines.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple[Any, ...]


@dataclass
class Positions:
    """Line numbers (1-based) of values and keys by their path in the document."""

    value_lines: dict[Path_, int] = field(default_factory=dict)
    key_lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, path: Path_, *, key: bool = False) -> int | None:
        """Line of `path`, or of its nearest ancestor that exists (a missing field points at its parent)."""
        table = self.key_lines if key else self.value_lines
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if key and p in self.value_lines:
                return self.value_lines[p]
            p = p[:-1]
        return self.value_lines.get((), 1)


@dataclass(frozen=True)
class Duplicate:
    path: Path_
    line: int
    first_line: int


try:  # libyaml's parser: a 4,096-host spec parses in a fraction of the pure-Python parser's time
    from yaml.cyaml import CParser as _FastParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _FastParser = None


if _FastParser is not None:

    class _Base(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver, _FastParser):  # type: ignore[misc,valid-type]
        """libyaml parses, PyYAML's own composer composes (in Python: nesting too deep is a RecursionError,
        reported with its line, never a C stack overflow), the safe constructor constructs."""

        def __init__(self, stream: str):
            yaml.reader.Reader(stream)  # refuses what YAML does not allow, as the pure-Python reader words it
            _FastParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

else:  # pragma: no cover
    _Base = yaml.SafeLoader  # type: ignore[misc,assignment]


class _Loader(_Base):
    """SafeLoader that records positions per container and collects duplicate keys."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._container_lines: dict[int, tuple[int, dict[Any, tuple[int, int]]]] = {}
        self._duplicates: list[tuple[int, Any, int, int]] = []  # (container id, key, line, first line)
        self._keep: list[Any] = []  # keep containers alive so their ids stay unique

    def _positioned_mapping(self, node: yaml.MappingNode) -> dict:
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        lines: dict[Any, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found a key that is not a plain value",
                    key_node.start_mark,
                )
            if key in mapping:
                self._duplicates.append((id(mapping), key, key_node.start_mark.line + 1, lines[key][0]))
            mapping[key] = self.construct_object(value_node, deep=True)
            lines[key] = (key_node.start_mark.line + 1, value_node.start_mark.line + 1)
        self._container_lines[id(mapping)] = (node.start_mark.line + 1, lines)
        self._keep.append(mapping)
        return mapping

    def _positioned_sequence(self, node: yaml.SequenceNode) -> list:
        items = [self.construct_object(child, deep=True) for child in node.value]
        lines = {i: (child.start_mark.line + 1, child.start_mark.line + 1) for i, child in enumerate(node.value)}
        self._container_lines[id(items)] = (node.start_mark.line + 1, lines)
        self._keep.append(items)
        return items


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader._positioned_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader._positioned_sequence)


#: Bounds on what a spec may expand to: a YAML alias can repeat a whole subtree, so nine aliases of
#: nine aliases are 9**9 values built from a few lines ("billion laughs"); nesting thousands of levels
#: deep exhausts the stack. Both are checked on the composed node graph, before anything is built.
MAX_VALUES = 200_000
MAX_DEPTH = 64


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_shape(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand to more than MAX_VALUES values, that nests deeper than
    MAX_DEPTH, or that contains itself (``&a [*a]``): one pass over the graph, aliases memoized."""
    size: dict[int, int] = {}
    on_path = {id(root)}
    stack = [(root, 0, iter(_children(root)))]
    while stack:
        node, depth, todo = stack[-1]
        child = next(todo, None)
        if child is None:
            stack.pop()
            on_path.discard(id(node))
            size[id(node)] = total = 1 + sum(size[id(c)] for c in _children(node))
            if total > MAX_VALUES:
                raise YamlSyntaxError(
                    node.start_mark.line + 1,
                    f"this value expands to more than {MAX_VALUES} values through YAML aliases (an alias bomb?); "
                    "write the values out, or use fewer nested aliases",
                )
            continue
        if id(child) in on_path:
            raise YamlSyntaxError(child.start_mark.line + 1, "a YAML alias refers to a value that contains it")
        if id(child) in size:
            continue
        if depth + 1 > MAX_DEPTH:
            raise YamlSyntaxError(child.start_mark.line + 1, f"nested more than {MAX_DEPTH} levels deep")
        on_path.add(id(child))
        stack.append((child, depth + 1, iter(_children(child))))


def _too_deep_at(text: str) -> int | None:
    """The line where nesting passes MAX_DEPTH, from the (non-recursive) scanner's tokens: only
    called when composing ran out of stack, so a normal spec never pays for it."""
    opening = (
        yaml.BlockMappingStartToken,
        yaml.BlockSequenceStartToken,
        yaml.FlowMappingStartToken,
        yaml.FlowSequenceStartToken,
    )
    closing = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
    depth = 0
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, opening):
                depth += 1
                if depth > MAX_DEPTH:
                    return token.start_mark.line + 1
            elif isinstance(token, closing):
                depth -= 1
    except (yaml.YAMLError, RecursionError):
        return None
    return None


def _codepoint(char: str | int) -> str:
    code = char if isinstance(char, int) else ord(char[:1] or "\0")
    return f"U+{code:04X}" + (" (NUL)" if code == 0 else "")


class YamlSyntaxError(Exception):
    def __init__(self, line: int | None, message: str):
        self.line = line
        self.message = message
        super().__init__(message)


def load(text: str) -> tuple[Any, Positions, list[Duplicate]]:
    """Parse one YAML document; return its data, the positions of everything, and duplicate keys."""
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, other C0 controls)
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        raise YamlSyntaxError(
            line, f"contains the character {_codepoint(exc.character)}, which YAML does not allow; remove it"
        ) from None
    try:
        if not loader.check_node():
            return None, Positions(value_lines={(): 1}), []
        node = loader.get_node()
        _check_shape(node)
        if loader.check_node():
            extra = loader.get_node()
            raise YamlSyntaxError(
                extra.start_mark.line + 1,
                "found a second YAML document ('---'); a cluster spec is one document",
            )
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise YamlSyntaxError(line, f"invalid YAML: {what}") from None
    except yaml.YAMLError as exc:  # pragma: no cover - unmarked errors are rare
        raise YamlSyntaxError(None, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlSyntaxError(_too_deep_at(text), f"nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()

    positions = Positions(value_lines={(): node.start_mark.line + 1})
    by_id: dict[int, Path_] = {}

    def walk(obj: Any, path: Path_) -> None:
        info = loader._container_lines.get(id(obj))
        if info is None:
            return
        by_id.setdefault(id(obj), path)
        _, lines = info
        children = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, child in children:
            key_line, value_line = lines.get(k, (None, None))
            if key_line is not None:
                positions.key_lines[(*path, k)] = key_line
                positions.value_lines[(*path, k)] = value_line
            walk(child, (*path, k))

    walk(data, ())
    duplicates = [
        Duplicate(path=(*by_id[cid], key), line=line, first_line=first)
        for cid, key, line, first in loader._duplicates
        if cid in by_id
    ]
    return data, positions, duplicates
