"""Remote file names are hostile input: absolute paths and ``..`` never leave the destination, and
nothing is written through a symlink."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from ..runs.untrusted import made_dir_mode


class UnsafePath(ValueError):
    pass


def safe_relpath(rel: str) -> PurePosixPath:
    """A remote relative path we accept, or UnsafePath: no absolute, no '..', no NUL, not empty."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UnsafePath(f"bad file name {rel!r}")
    if rel.startswith("/") or rel.startswith("\\"):
        raise UnsafePath(f"absolute path {rel!r}")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise UnsafePath(f"path {rel!r} would leave the destination")
    return PurePosixPath(*parts)


def dest_path(base: Path, rel: str) -> Path:
    """base/rel, creating real directories only; refuses anything that resolves outside base."""
    rp = safe_relpath(rel)
    if base.is_symlink():  # (resolved, a link planted at RUN/checkpoints sent every write through it)
        raise UnsafePath(f"{base} is a symlink; refusing to write through it")
    base = base.resolve()
    cur = base
    for part in rp.parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePath(f"{cur} is a symlink; refusing to write through it")
        cur.mkdir(mode=0o700, exist_ok=True)
    target = base.joinpath(*rp.parts)
    if target.is_symlink():
        raise UnsafePath(f"{target} is a symlink; refusing to write through it")
    real_parent = Path(os.path.realpath(target.parent))
    if real_parent != base and base not in real_parent.parents:
        raise UnsafePath(f"{rel!r} resolves outside {base}")
    return target


def real_dirs(root: Path, dest: Path) -> Path:
    """``dest`` (below ``root``, the run directory) as real directories, each made 0700 when absent: a
    link or file planted at any of them is refused (UnsafePath), never followed."""
    cur = root
    for part in dest.relative_to(root).parts:
        cur = cur / part
        if not stat.S_ISDIR(made_dir_mode(cur)):
            raise UnsafePath(f"{cur}: not a directory of the run (a link or a file planted there?); not written")
    return dest
