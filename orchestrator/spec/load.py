"""Load a cluster spec file and report every problem at once, each as FILE:LINE: field.path: message.

Field checks come from pydantic; the rules across fields (same GPU count everywhere, unique ports,
...) run on the raw document too, leniently, so a type error elsewhere does not hide them.
"""

from __future__ import annotations

import os
import stat
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..core.diagnostics import Diagnostic
from ..core.errors import SpecError, UsageError
from .model import ClusterSpec
from .rules import cross_field_problems, format_path
from .sections import spec_model
from .yamlpos import Positions, YamlSyntaxError, load

MAX_SPEC_BYTES = 10_000_000  # 10,000 hosts take ~0.4 MB

REQUIRED_HINTS = {
    ("version",): "required: the spec format version, 1",
    ("name",): "required: the job name, e.g. resnet-4x8",
    ("hosts",): "required: a list of hosts, each with an address",
    ("job",): "required: a job section with at least job.command",
    ("job", "command"): "required: the training command, e.g. [python, train.py]",
}


@dataclass(frozen=True)
class LoadedSpec:
    """A valid spec plus what was said about it (warnings) and where it came from."""

    spec: ClusterSpec
    path: str
    text: str
    warnings: tuple[Diagnostic, ...] = ()


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file; raise SpecError with every problem, or UsageError if unreadable."""
    raw = _read_bounded(str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError([Diagnostic.at(str(path), line, "spec", "not valid UTF-8 text")]) from None
    return load_spec_text(text, str(path))


def _read_bounded(path: str) -> bytes:
    """At most MAX_SPEC_BYTES of a regular file or a pipe (``<(cat spec)``), in bounded time: a device
    (``/dev/zero``, a terminal) or a socket is refused before a byte is read, and a pipe that goes on
    past the cap is cut off there. Opening never blocks (a FIFO without a writer reads as empty)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{path}: is a directory, expected a cluster spec file (YAML)")
        if stat.S_ISREG(st.st_mode) and st.st_size > MAX_SPEC_BYTES:
            raise UsageError(
                f"{path}: {st.st_size / 1e6:.1f} MB; a cluster spec is at most {MAX_SPEC_BYTES // 10**6} MB"
            )
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise UsageError(f"{path}: is a {_file_kind(st.st_mode)}, expected a cluster spec file (YAML)")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_SPEC_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise UsageError(f"{path}: more than {MAX_SPEC_BYTES // 10**6} MB; a cluster spec is at most that")
        return b"".join(chunks)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def load_spec_text(text: str, filename: str = "<spec>") -> LoadedSpec:
    problems, spec = _checked(text, filename)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        raise SpecError(problems)
    return LoadedSpec(spec=spec, path=filename, text=text, warnings=tuple(problems))


def check_spec_text(text: str, filename: str) -> list[Diagnostic]:
    """Every problem (errors and warnings) of a spec text, sorted by line."""
    return _checked(text, filename)[0]


def _checked(text: str, filename: str) -> tuple[list[Diagnostic], ClusterSpec | None]:
    """Every problem of a spec text, and the validated spec when the model took it: parsed and validated
    once (a 4,096-host spec is read in a second, not two)."""
    try:
        data, positions, duplicates = load(text)
    except YamlSyntaxError as exc:
        return [Diagnostic.at(filename, exc.line, "spec", exc.message)], None

    if data is None:
        return [
            Diagnostic.at(
                filename,
                1,
                "spec",
                "the file is empty; a cluster spec needs at least version, name, hosts and job.command "
                "(see `tfcluster schema` or cluster_specs/reference.yaml)",
            )
        ], None
    if not isinstance(data, dict):
        kind = type(data).__name__ if not isinstance(data, list) else "a list"
        return [
            Diagnostic.at(
                filename,
                positions.line_of(()),
                "spec",
                f"the document must be a mapping of fields (version, name, hosts, job, ...), got {kind}",
            )
        ], None

    problems: list[Diagnostic] = []
    for dup in duplicates:
        problems.append(
            Diagnostic.at(
                filename,
                dup.line,
                format_path(dup.path),
                f"duplicate key (first set at line {dup.first_line}); YAML would silently keep only the last one",
            )
        )

    spec = None
    try:
        spec = spec_model().model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(_problem_from_pydantic(err, filename, positions, data))

    problems.extend(cross_field_problems(data, filename, positions))
    # One message per (path, message): a duplicate key and a type error can coincide.
    unique = {(p.line, p.field, p.message): p for p in problems}
    return sorted(unique.values(), key=lambda p: (p.line or 0, p.field or "")), spec


# --- pydantic errors → user messages ---------------------------------------------------------


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of `loc` (to list allowed fields)."""
    model: Any = spec_model()
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        fld = model.model_fields.get(part)
        if fld is None:
            return None
        model = _unwrap(fld.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """list[HostSpec] -> HostSpec, Optional[X] -> X."""
    for arg in typing.get_args(annotation) or ():
        inner = _unwrap(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return annotation


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _problem_from_pydantic(err: dict, filename: str, positions: Positions, data: Any) -> Diagnostic:
    loc = tuple(err["loc"])
    kind = err["type"]
    msg = err["msg"]
    value = err.get("input")
    if kind == "extra_forbidden":
        name = loc[-1]
        model = _model_at(loc)
        allowed = sorted(model.model_fields) if model else []
        import difflib  # only on this error path: 37 ms of import for every spec otherwise

        close = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        message = f"unknown field '{name}'{hint}; allowed here: {', '.join(allowed)}"
        return Diagnostic.at(filename, positions.line_of(loc, key=True), format_path(loc), message)
    if kind == "missing":
        message = REQUIRED_HINTS.get(loc)
        if message is None and loc[-1] == "address":
            message = "required: the host's IP address or hostname"
        return Diagnostic.at(filename, positions.line_of(loc), format_path(loc), message or "required field is missing")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    elif msg.startswith("Input should be"):
        msg = msg.replace("Input should be", "must be", 1) + f", got {_describe(value)}"
    if kind == "literal_error" and loc == ("version",):
        msg = f"must be 1 (the only spec version), got {_describe(value)}"
    if kind == "too_short" and loc == ("hosts",):
        msg = "must list at least one host"
    # A field error inside a union branch (e.g. `list[str] | str`) names the branch; drop it.
    loc = tuple(p for p in loc if p != "[key]")
    return Diagnostic.at(filename, positions.line_of(loc), format_path(loc), msg)
