"""Files and directories inside a run directory that anyone with access to a shared ``runs/`` could have
planted: read without following a link or blocking on a FIFO, written only into a real directory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from .rundir import MAX_JSON, open_regular


def read_tail(path: Path, size: int) -> bytes:
    """The last ``size`` bytes of a regular file (``open_regular``: no link, no FIFO; b"" otherwise)."""
    try:
        with open_regular(path) as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read(size)
    except OSError:
        return b""


def read_json_strict(path: Path, limit: int = MAX_JSON) -> Any:
    """The JSON value of a run's file, or None when it is absent; a ValueError saying why when it is no
    JSON file (a link, a FIFO, larger than ``limit``, not JSON); a PermissionError as it comes."""
    try:
        with open_regular(path) as f:  # a FIFO or device planted in a shared runs/ cannot hang us
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise
    except OSError as exc:
        raise ValueError(f"{path.name}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise ValueError(f"{path.name}: larger than {limit >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path.name}: not JSON ({str(exc)[:120]})") from exc


def made_dir_mode(path: Path) -> int:
    """``path`` made a directory (0700) if nothing is there; the ``lstat`` mode of what is there now (a
    link is a link: the caller refuses anything but a directory). OSError if it cannot be made."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    return os.lstat(path).st_mode


def private_subdir(path: Path) -> Path:
    """``path`` (a directory of the run: ``report/``) made 0700 if it is absent; a UsageError naming it
    if something else is there — a link planted there sent ``report --html`` to write wherever it pointed."""
    try:
        mode = made_dir_mode(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot make the directory ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
        raise UsageError(f"{path}: {kind} (planted in the run directory?); move it away and run again")
    return path
