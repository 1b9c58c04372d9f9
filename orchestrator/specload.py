"""Load a cluster spec file and report every problem at once, each as FILE:LINE: field.path: message.

Field checks come from pydantic; the rules across fields (same GPU count everywhere, unique ports,
...) run on the raw document too, leniently, so a type error elsewhere does not hide them.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import Problem, SpecError, UsageError
from .spec import ClusterSpec, HeartbeatSpec, SshSpec, TensorflowSpec, is_loopback
from .yamlpos import Positions, YamlSyntaxError, load

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
    warnings: tuple[Problem, ...] = ()


def format_path(loc: Iterable[Any]) -> str:
    """('hosts', 1, 'gpus') -> 'hosts[1].gpus'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "spec"


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file; raise SpecError with every problem, or UsageError if unreadable."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a cluster spec file (YAML)") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError([Problem(str(path), line, "spec", "not valid UTF-8 text")]) from None
    return load_spec_text(text, str(path))


def load_spec_text(text: str, filename: str = "<spec>") -> LoadedSpec:
    problems = check_spec_text(text, filename)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise SpecError(problems)
    data, _, _ = load(text)
    spec = ClusterSpec.model_validate(data)
    return LoadedSpec(spec=spec, path=filename, text=text, warnings=tuple(problems))


def check_spec_text(text: str, filename: str) -> list[Problem]:
    """Every problem (errors and warnings) of a spec text, sorted by line."""
    try:
        data, positions, duplicates = load(text)
    except YamlSyntaxError as exc:
        return [Problem(filename, exc.line, "spec", exc.message)]

    if data is None:
        return [
            Problem(
                filename,
                1,
                "spec",
                "the file is empty; a cluster spec needs at least version, name, hosts and job.command "
                "(see `tfcluster schema` or cluster_specs/reference.yaml)",
            )
        ]
    if not isinstance(data, dict):
        kind = type(data).__name__ if not isinstance(data, list) else "a list"
        return [
            Problem(
                filename,
                positions.line_of(()),
                "spec",
                f"the document must be a mapping of fields (version, name, hosts, job, ...), got {kind}",
            )
        ]

    problems: list[Problem] = []
    for dup in duplicates:
        problems.append(
            Problem(
                filename,
                dup.line,
                format_path(dup.path),
                f"duplicate key (first set at line {dup.first_line}); YAML would silently keep only the last one",
            )
        )

    try:
        ClusterSpec.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(_problem_from_pydantic(err, filename, positions, data))

    problems.extend(_cross_field_problems(data, filename, positions))
    # One message per (path, message): a duplicate key and a type error can coincide.
    unique = {(p.line, p.path, p.message): p for p in problems}
    return sorted(unique.values(), key=lambda p: (p.line or 0, p.path))


# --- pydantic errors → user messages ---------------------------------------------------------


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of `loc` (to list allowed fields)."""
    model: Any = ClusterSpec
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


def _problem_from_pydantic(err: dict, filename: str, positions: Positions, data: Any) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    msg = err["msg"]
    value = err.get("input")
    if kind == "extra_forbidden":
        name = loc[-1]
        model = _model_at(loc)
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        message = f"unknown field '{name}'{hint}; allowed here: {', '.join(allowed)}"
        return Problem(filename, positions.line_of(loc, key=True), format_path(loc), message)
    if kind == "missing":
        message = REQUIRED_HINTS.get(loc)
        if message is None and loc[-1] == "address":
            message = "required: the host's IP address or hostname"
        return Problem(filename, positions.line_of(loc), format_path(loc), message or "required field is missing")
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
    return Problem(filename, positions.line_of(loc), format_path(loc), msg)


# --- rules across fields ---------------------------------------------------------------------


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default


def _int_or(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _cross_field_problems(data: dict, filename: str, positions: Positions) -> list[Problem]:
    """MWMS and networking rules that no single field can check. Malformed parts are skipped."""
    out: list[Problem] = []

    def add(loc: tuple, message: str, severity: str = "error") -> None:
        out.append(Problem(filename, positions.line_of(loc), format_path(loc), message, severity))

    hosts = _get(data, "hosts")
    hosts = hosts if isinstance(hosts, list) else []
    ssh = _get(data, "ssh", {})
    tf = _get(data, "tensorflow", {})
    default_ssh_port = _int_or(_get(ssh, "port"), SshSpec.model_fields["port"].default or 22)
    default_tf_port = _int_or(_get(tf, "port"), TensorflowSpec.model_fields["port"].default)

    # MWMS runs the same replica count on every task; a different GPU count misbehaves silently.
    gpu_counts = [(i, _get(h, "gpus", 0)) for i, h in enumerate(hosts) if isinstance(h, dict)]
    gpu_counts = [(i, g) for i, g in gpu_counts if isinstance(g, int) and not isinstance(g, bool) and g >= 0]
    if gpu_counts:
        first_i, first_g = gpu_counts[0]
        for i, g in gpu_counts[1:]:
            if g != first_g:
                add(
                    ("hosts", i, "gpus"),
                    f"{g} GPUs but hosts[{first_i}] has {first_g}; MultiWorkerMirroredStrategy needs the same "
                    "number of GPUs on every task (use the same gpus: on every host)",
                )

    seen_ssh: dict[tuple[str, int], int] = {}
    seen_tf: dict[tuple[str, int], int] = {}
    for i, h in enumerate(hosts):
        address = _get(h, "address")
        if not isinstance(address, str):
            continue
        ssh_port = _int_or(_get(h, "port"), default_ssh_port)
        key = (address.lower(), ssh_port)
        if key in seen_ssh:
            add(
                ("hosts", i, "address"),
                f"{address} port {ssh_port} is already hosts[{seen_ssh[key]}]; every host entry is one task "
                "and needs its own (address, ssh port)",
            )
        else:
            seen_ssh[key] = i
        tf_port = _int_or(_get(h, "tf_port"), default_tf_port)
        tf_addr = _get(h, "tf_address") if isinstance(_get(h, "tf_address"), str) else address
        machine = "loopback" if is_loopback(tf_addr) else tf_addr.lower()
        tkey = (machine, tf_port)
        if tkey in seen_tf:
            j = seen_tf[tkey]
            where = "loopback addresses share this machine's network stack" if machine == "loopback" else ""
            add(
                ("hosts", i, "tf_port") if "tf_port" in h else ("hosts", i),
                f"TF port {tf_port} is already used by hosts[{j}] on the same machine; TensorFlow's gRPC "
                f"server binds every address{' (' + where + ')' if where else ''}, so give each task on one "
                "machine its own tf_port",
            )
        else:
            seen_tf[tkey] = i

    hb = _get(data, "heartbeat", {})
    interval = _get(hb, "interval_s", HeartbeatSpec.model_fields["interval_s"].default)
    timeout = _get(hb, "timeout_s", HeartbeatSpec.model_fields["timeout_s"].default)
    if (
        isinstance(interval, int | float)
        and isinstance(timeout, int | float)
        and not isinstance(interval, bool)
        and not isinstance(timeout, bool)
        and timeout <= interval
    ):
        add(
            ("heartbeat", "timeout_s"),
            f"must exceed heartbeat.interval_s ({interval}); a worker would be declared lost between two "
            "heartbeats (use at least 3x the interval)",
        )

    if isinstance(_get(tf, "collective_timeout_s"), int | float) and not isinstance(
        _get(tf, "collective_timeout_s"), bool
    ):
        add(
            ("tensorflow", "collective_timeout_s"),
            "TensorFlow 2.21 starts one thread per collective that lives for the whole timeout: at ~100 "
            "collectives/s that is thousands of threads and much slower steps (docs/benchmarks.md). "
            "tfcluster's heartbeats already catch hung peers; prefer null",
            "warning",
        )

    comm = _get(tf, "communication", "auto")
    if comm == "nccl" and gpu_counts and all(g == 0 for _, g in gpu_counts):
        add(
            ("tensorflow", "communication"),
            "nccl needs GPUs but every host has gpus: 0; TensorFlow will fall back with a warning (use auto or ring)",
            "warning",
        )
    return out
