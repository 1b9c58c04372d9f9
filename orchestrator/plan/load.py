"""Spec file → (LoadedSpec, Plan), the way every command builds its plan (with ~/.ssh/config)."""

from __future__ import annotations

import os
import re
import secrets
from datetime import UTC, datetime

from pydantic import ValidationError

from ..core.diagnostics import Diagnostic
from ..core.errors import SpecError, UsageError
from ..spec import ClusterSpec, LoadedSpec, format_path, load_spec
from ..spec.model import JobSpec
from .build import build_plan
from .model import Plan
from .sshconfig import SshConfigError, local_user, ssh_config_lookup


def default_run_id(name: str) -> str:
    """NAME-<UTC time>-<4 hex>: unique, because it names the run's directories on every node (two runs
    sharing one would mix their logs and checkpoints)."""
    return f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(2)}"


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


def load_plan(spec_path: str, run_id: str | None = None, command: list[str] | None = None) -> tuple[LoadedSpec, Plan]:
    """Validate the spec (``command`` overrides job.command) and plan it as ``launch`` would."""
    loaded = load_spec(spec_path)
    spec = loaded.spec
    if command:
        spec = spec.model_copy(update={"job": override_command(spec, command)})
        loaded = LoadedSpec(spec=spec, path=loaded.path, text=loaded.text, warnings=loaded.warnings)
    return loaded, plan_loaded(loaded, run_id)


def plan_loaded(loaded: LoadedSpec, run_id: str | None = None) -> Plan:
    """The plan of an already validated spec (with ~/.ssh/config for scheduler: ssh)."""
    spec = loaded.spec
    try:
        lookup = ssh_config_lookup(spec.ssh.config_file) if spec.scheduler == "ssh" else None
    except SshConfigError as exc:
        raise UsageError(f"ssh.config_file: {exc}") from None
    return build_plan(spec, run_id=run_id or default_run_id(spec.name), local_user=local_user(), ssh_lookup=lookup)
