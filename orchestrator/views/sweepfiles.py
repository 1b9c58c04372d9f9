"""The files `predict` reads beside a run or a sweep (scale.json, check.json), read as untrusted: a
shared runs/ holds what anyone planted. No link followed, no FIFO waited on, a bounded size, every
field checked before use; a sweep's runs are its own directories, never a path the file names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..runs.untrusted import read_json_strict

CHECK_JSON = "check.json"
SCALE_JSON = "scale.json"
MAX_WORKERS = 1 << 20


def read_json_file(path: Path, what: str) -> Any:
    """The JSON value of ``path`` (a regular file, at most ``MAX_JSON`` bytes); a UsageError naming
    ``what`` (the option or file) and why otherwise."""
    try:
        data = read_json_strict(path)
    except (ValueError, PermissionError) as exc:
        raise UsageError(f"{what}: unreadable ({exc}; a link or a FIFO is not read)") from None
    if data is None:
        raise UsageError(f"{what}: no such file")
    return data


def sweep_sizes(root: Path) -> list[dict[str, Any]]:
    """The measured sizes of a `scale` sweep's scale.json (those with a run and a split, as written).
    Each size's ``run_dir`` is taken as the sweep's own directory of that name (``root/workers-N``):
    a scale.json naming /etc made predict read /etc/heartbeats.jsonl, and a sweep moved since still
    finds its runs."""
    where = root / SCALE_JSON
    data = read_json_file(where, str(where))
    sizes = data.get("sizes") if isinstance(data, dict) else None
    if not isinstance(sizes, list):
        raise UsageError(f"{where}: sizes: expected a list of the sweep's measured sizes")
    out = []
    for i, size in enumerate(sizes):
        if not isinstance(size, dict) or not size.get("run_dir") or not size.get("split"):
            continue  # a size that did not run, or ran without the step clock: nothing measured
        workers, run_dir = size.get("workers"), size.get("run_dir")
        if type(workers) is not int or not 1 <= workers <= MAX_WORKERS:
            raise UsageError(f"{where}: sizes[{i}].workers: expected a whole number from 1, got {str(workers)[:40]!r}")
        name = Path(run_dir).name if isinstance(run_dir, str) else ""
        if name in ("", ".", ".."):
            raise UsageError(
                f"{where}: sizes[{i}].run_dir: expected the size's run directory, got {str(run_dir)[:80]!r}"
            )
        out.append({**size, "run_dir": str(root / name)})
    return out
