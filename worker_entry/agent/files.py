"""Node side of gathering: list a directory, stream files with their sha256, clean temp copies.

The launcher treats what we send as hostile, but we are careful too: nothing is opened through a
symlink (every path component is opened with O_NOFOLLOW relative to its parent), so a link to
/etc inside a checkpoint directory is reported, not read.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from typing import Any

from .. import protocol as p
from .safedir import open_dir

CHUNK = 1024 * 1024
TEMP_PREFIX = "workertemp_"


def _sha256() -> Any:
    """hashlib's sha256, imported when a file is hashed: most tasks end with nothing to send, and the
    import (OpenSSL's bindings) costs every host ~3 ms before its hello."""
    import hashlib

    return hashlib.sha256()


def _root(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def manifest(root: str, exclude_prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """Regular files under root (relative paths, size, mtime); symlinks and specials are skipped."""
    root = _root(root)
    out: dict[str, Any] = {"root": root, "exists": os.path.isdir(root), "files": [], "skipped": []}
    if not out["exists"]:
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in dirnames:
            rel = os.path.join(rel_dir, d)
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                out["skipped"].append({"path": rel, "reason": f"symlink to {os.readlink(full)} (not followed)"})
            elif not rel_dir and d.startswith(exclude_prefixes):
                out["skipped"].append({"path": rel, "reason": "excluded (temporary copy of a non-chief worker)"})
            else:
                keep.append(d)
        dirnames[:] = sorted(keep)
        for name in sorted(filenames):
            rel = os.path.join(rel_dir, name)
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError as exc:
                out["skipped"].append({"path": rel, "reason": exc.strerror})
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(os.path.join(dirpath, name))
                out["skipped"].append({"path": rel, "reason": f"symlink to {target} (not followed)"})
            elif not stat.S_ISREG(st.st_mode):
                out["skipped"].append({"path": rel, "reason": "not a regular file"})
            else:
                out["files"].append({"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def open_beneath(root: str, rel: str) -> int:
    """Open root/rel for reading without following any symlink and without leaving root."""
    parts = [x for x in rel.split("/") if x not in ("", ".")]
    if not parts or any(x == ".." for x in parts):
        raise PermissionError(f"refusing path {rel!r}")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    dfd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in parts[:-1]:
            nfd = os.open(part, flags | getattr(os, "O_DIRECTORY", 0), dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        fd = os.open(parts[-1], flags, dir_fd=dfd)
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(f"{rel!r} is not a regular file")
    return fd


def stream_files(root: str, files: list[dict[str, Any]], put: Callable[[bytes], None]) -> None:
    """Stream each requested file from its offset: header, data frames, trailer with the sha256 of
    the WHOLE file (bytes before the offset are hashed but not sent: the launcher already has them)."""
    root = _root(root)
    for req in files:
        rel = req["path"]
        offset = int(req.get("offset") or 0)
        try:
            fd = open_beneath(root, rel)
        except OSError as exc:
            put(p.msg_frame(p.FileError(path=rel, error=exc.strerror or str(exc))))
            continue
        with os.fdopen(fd, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            h = _sha256()
            if offset > size:
                offset = 0
            # the mtime of what is sent: a launcher copying a whole directory sees a file replaced since it listed it
            put(p.msg_frame(p.FileStart(path=rel, size=size, offset=offset, mtime_ns=st.st_mtime_ns)))
            left = offset
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            sent = offset
            while sent < size:  # what FileStart announced: a file that grows meanwhile is sent as it was
                chunk = f.read(min(CHUNK, size - sent))
                if not chunk:
                    break
                h.update(chunk)
                sent += len(chunk)
                put(p.data_frame(chunk))
            put(p.msg_frame(p.FileEnd(path=rel, size=sent, sha256=h.hexdigest())))
    put(p.msg_frame(p.Done()))


def send(root: str, files: list[dict[str, Any]], out_fd: int) -> int:
    """``worker_entry send``: the marker, then ``stream_files`` on ``out_fd``."""
    w = os.fdopen(out_fd, "wb", buffering=0)

    def put(data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = w.write(view)
            view = view[n:]

    put(p.MARKER)
    stream_files(root, files, put)
    return 0


def receive(root: str, in_fd: int, first: bytes = b"") -> dict[str, Any]:
    """Replace directory `root` with files streamed on stdin (header, data frames, end + sha256).

    Files land in a fresh sibling directory; only when every file verified is it swapped in, so a
    broken transfer never leaves a half-written backup where BackupAndRestore would read it.
    """
    root = _root(root)
    parent = os.path.dirname(root)
    try:
        os.close(open_dir(parent))  # made if missing; refused where another user could plant in it (safedir)
    except OSError as exc:
        return {"ok": False, "error": str(exc), "root": root}
    incoming = f"{root}.incoming-{os.getpid()}"
    shutil.rmtree(incoming, ignore_errors=True)
    os.makedirs(incoming, mode=0o700)
    decoder = p.FrameDecoder(synced=True)  # the launcher sends frames without a marker
    cur: dict[str, Any] | None = None
    files = 0
    done = False
    try:
        pending = first
        while not done:
            data = pending or os.read(in_fd, CHUNK)
            pending = b""
            if not data:
                break
            for fr in decoder.feed(data):
                if fr.type == p.T_DATA and cur is not None:
                    cur["f"].write(fr.payload)
                    cur["h"].update(fr.payload)
                    continue
                m = p.parse(fr.payload, p.TRANSFER_MESSAGES)
                if isinstance(m, p.FileStart):
                    rel = m.path
                    parts = [x for x in rel.split("/") if x not in ("", ".")]
                    if not parts or ".." in parts or rel.startswith("/"):
                        raise PermissionError(f"refusing path {rel!r}")
                    target = os.path.join(incoming, *parts)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                    cur = {"f": os.fdopen(fd, "wb"), "h": _sha256(), "path": target, "m": m}
                elif isinstance(m, p.FileEnd) and cur is not None:
                    cur["f"].close()
                    if cur["h"].hexdigest() != m.sha256:
                        raise OSError(f"{m.path}: sha256 mismatch")
                    mtime = cur["m"].mtime_ns
                    if mtime:
                        os.utime(cur["path"], ns=(mtime, mtime))
                    files += 1
                    cur = None
                elif isinstance(m, p.Done):
                    done = True
        if not done:
            raise OSError("transfer ended before it was complete")
        old = f"{root}.old-{os.getpid()}"
        if os.path.lexists(root):
            os.rename(root, old)
        os.rename(incoming, root)
        shutil.rmtree(old, ignore_errors=True)
        return {"ok": True, "files": files, "root": root}
    except (OSError, p.ProtocolError) as exc:
        shutil.rmtree(incoming, ignore_errors=True)
        return {"ok": False, "error": str(exc), "root": root}


def clean_temp_copies(dirs: list[str]) -> dict[str, Any]:
    """Remove workertemp_* directories (MWMS non-chief checkpoint copies) directly under `dirs`."""
    removed, errors = [], []
    for d in dirs:
        root = _root(d)
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        for name in os.listdir(root):
            full = os.path.join(root, name)
            if name.startswith(TEMP_PREFIX) and os.path.isdir(full) and not os.path.islink(full):
                try:
                    shutil.rmtree(full)
                    removed.append(full)
                except OSError as exc:
                    errors.append(f"{full}: {exc.strerror}")
    return {"removed": removed, "errors": errors}


def main(mode: str, config: dict[str, Any], rest: bytes = b"") -> int:
    if mode == "manifest":
        excl = tuple(config.get("exclude_prefixes") or ())
        result = {"manifests": [manifest(r, excl) for r in config["roots"]]}
        if config.get("clean"):
            result["cleaned"] = clean_temp_copies(config["clean"])
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        return 0
    if mode == "send":
        out_fd = os.dup(1)
        os.dup2(2, 1)
        return send(config["root"], config["files"], out_fd)
    if mode == "receive":
        result = receive(config["root"], 0, rest)
        sys.stdout.write(json.dumps(result) + "\n")
        return 0 if result["ok"] else 1
    return 2
