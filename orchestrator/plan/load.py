"""Run ids and the ``launch -- COMMAND`` override: what every scheduler's plan starts from. (Which planner
plans a spec is the scheduler's: ``orchestrator.schedulers.load_plan``.)"""

from __future__ import annotations

import os
import re
import secrets
from datetime import UTC, datetime

from pydantic import ValidationError

from ..core.diagnostics import Diagnostic
from ..core.errors import SpecError, UsageError
from ..spec import ClusterSpec, LoadedSpec, format_path
from ..spec.model import JobSpec


def default_run_id(name: str) -> str:
    """NAME-<UTC time>-<4 hex>: unique, because it names the run's directories on every node (two runs
    sharing one would mix their logs and checkpoints)."""
    return f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(2)}"


#: A run id names directories on every node and lines of generated scripts: a safe path component, always
#: (``plan --run-id`` took "x\ntouch ..." into the Slurm batch script, and "../../etc" into paths)
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str, option: str = "--run-id") -> str:
    """``run_id`` if it is one (letters, digits, '.', '_', '-'; up to 128; not '.' or '-' first); a
    UsageError naming ``option`` otherwise."""
    if not RUN_ID_RE.fullmatch(run_id):
        raise UsageError(
            f"{option} {run_id[:80]!r}: a run id is letters, digits, '.', '_' and '-' (up to 128), not '.' or '-' first"
        )
    return run_id


def run_id_for_dir(run_dir: str) -> str:
    """The run id of an explicit --run-dir: its name, made a safe path component, made unique."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", os.path.basename(os.path.normpath(run_dir))).strip(".-") or "run"
    return default_run_id(base[:64])


def override_command(spec: ClusterSpec, command: list[str]) -> JobSpec:
    """job with ``command`` (from ``launch -- COMMAND``), validated exactly like the spec's own."""
    try:
        return JobSpec.model_validate({**spec.job.model_dump(), "command": command})
    except ValidationError as exc:
        problems = [
            Diagnostic.at("launch -- COMMAND", None, format_path(("job", *err["loc"])), _message(err))
            for err in exc.errors(include_url=False)
        ]
        raise SpecError(problems) from None


def _message(err: dict) -> str:
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg


def with_command(loaded: LoadedSpec, command: list[str] | None) -> LoadedSpec:
    """The spec with ``launch -- COMMAND`` as its job.command (validated like the spec's own)."""
    if not command:
        return loaded
    spec = loaded.spec.model_copy(update={"job": override_command(loaded.spec, command)})
    return LoadedSpec(spec=spec, path=loaded.path, text=loaded.text, warnings=loaded.warnings)
