"""The copy of a spec kept in the run directory, with its credentials hidden (core/redact.py's rules).

The user's text is kept (comments, layout) with each secret value replaced; where a value cannot be
found literally (YAML escapes), the copy is the validated spec dumped as YAML instead — never a
copy that still holds a secret.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..core.redact import REDACTED, redact_argv, redact_env, redact_text, secret_values
from .load import LoadedSpec

MIN_LITERAL = 4  # shorter values could match other text ("1" in "version: 1"): dump instead


def path_values(spec: Any) -> dict[str, str]:
    """The spec's directories and URLs (a checkpoint dir may be ``s3://KEY:SECRET@bucket``): checked for
    credentials like the environment's values (they leaked into plan.json and the spec's copy)."""
    fields = {
        "job.workdir": spec.job.workdir,
        "job.remote_dir": spec.job.remote_dir,
        "checkpoint.dir": getattr(spec.checkpoint, "dir", None),
        "restart.backup_dir": getattr(spec.restart, "backup_dir", None),
        "tensorboard.dir": getattr(spec.tensorboard, "dir", None),
    }
    return {k: v for k, v in fields.items() if isinstance(v, str) and v}


def redacted_text(loaded: LoadedSpec) -> str:
    job = loaded.spec.job
    values = secret_values({**path_values(loaded.spec), **job.env}, job.command)
    if not values:
        return loaded.text
    text = loaded.text
    if all(len(v) >= MIN_LITERAL for v in values):
        for v in values:
            text = text.replace(v, REDACTED)
        if not _leaks(text, values):
            return text
    return "# secrets redacted by tfcluster (comments and layout not kept)\n" + yaml.safe_dump(
        _redacted_data(loaded), sort_keys=False
    )


def _leaks(text: str, values: list[str]) -> bool:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return True
    flat: list[str] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(k)
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)
        elif obj is not None:
            flat.append(str(obj))

    walk(data)
    return any(v in item for item in flat for v in values)


def _redacted_data(loaded: LoadedSpec) -> dict[str, Any]:
    data = loaded.spec.model_dump(mode="json", exclude_unset=True)
    job = data.setdefault("job", {})
    job["command"] = redact_argv(loaded.spec.job.command)
    if "env" in job:
        job["env"] = redact_env(loaded.spec.job.env)
    for dotted, value in path_values(loaded.spec).items():
        section, key = dotted.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            data[section][key] = redact_text(value)
    return data
