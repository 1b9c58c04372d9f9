"""Directories and files of a task in a place other users can write to (/tmp, a shared scratch).

``job.remote_dir`` and ``restart.backup_dir`` may sit where another user can create entries first: a
directory of theirs on the task's path, or ``output.log -> a file of the victim``, would make the task
write where that user chose. So every component of such a path is opened from ``/`` down with
``O_NOFOLLOW`` relative to its parent's descriptor (no name is resolved twice) and accepted only when
another user cannot change it: owned by root or by this user, and writable by group or others only
with the sticky bit (``/tmp``: nobody else can rename or remove what is ours in it). A symbolic link
is followed only when root or this user owns it (``/home -> /export/home``). The directories the task
makes are this user's, mode 0700; the task directory itself must be this user's. The files the task
writes are opened relative to the verified directory's descriptor, never following a link. Anything
else is an ``UnsafePath`` naming the component, its owner and mode, and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
MAX_LINKS = 40  # like the kernel's own limit on symbolic links in one path


class UnsafePath(OSError):
    """A path the task must not use: another user could change what it names."""


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _judge(st: os.stat_result, where: str, uid: int, mine: bool) -> None:
    if st.st_uid not in (0, uid) or (mine and st.st_uid != uid):
        raise UnsafePath(
            f"{where} belongs to {_who(st.st_uid)}, not to this user ({_who(uid)}): that user could put "
            "links or files where this task writes"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(
            f"{where} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}) without the sticky bit: another user could replace "
            "what this task creates in it"
        )


def open_dir(path: str, create: bool = True) -> int:
    """A descriptor of directory ``path`` (``~`` expanded; missing components made 0700 when
    ``create``), every component checked as the module says; the last one must be this user's."""
    uid = os.geteuid()
    full = os.path.abspath(os.path.expanduser(path))
    todo = [x for x in full.split("/") if x]
    fd = os.open("/", DIR_FLAGS & ~os.O_NOFOLLOW)
    where = "/"
    links = 0
    try:
        _judge(os.fstat(fd), where, uid, False)
        while todo:
            part = todo.pop(0)
            if part in (".", ".."):
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd, where = nfd, os.path.normpath(os.path.join(where, part))
                continue
            name = os.path.join(where, part)
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # another task of this run made it first
                    os.mkdir(part, 0o700, dir_fd=fd)
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise UnsafePath(f"{name} is not a directory") from None
                if st.st_uid not in (0, uid):
                    raise UnsafePath(
                        f"{name} is a symbolic link made by {_who(st.st_uid)}: not followed (it could point "
                        "this task's files at anything that user chooses)"
                    ) from None
                links += 1
                if links > MAX_LINKS:
                    raise UnsafePath(f"{path}: too many symbolic links") from None
                target = os.readlink(part, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd, where = os.open("/", DIR_FLAGS & ~os.O_NOFOLLOW), "/"
                todo = [x for x in target.split("/") if x] + todo
                continue
            os.close(fd)
            fd, where = nfd, name
            _judge(os.fstat(fd), where, uid, not todo)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_file(dir_fd: int, name: str, *, exclusive: bool = False) -> int:
    """A new (``exclusive``: after removing an old one) or truncated regular file ``name`` in a
    verified directory, mode 0600, never through a link; its descriptor, blocking."""
    if exclusive:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
    flags = FILE_FLAGS | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{name} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fix_hint(what: str) -> str:
    return (
        f"set {what} to a directory only you can write (e.g. under your home), or remove what the other user made there"
    )
