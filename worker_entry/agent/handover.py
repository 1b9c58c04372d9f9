"""After the task: tell the launcher what it may still want, and serve it on the same channel.

Right after ``exited`` the node sends ``task_files`` — the listing of its task directory (the full
output log, exit.json), the size of the log it wrote, and for the chief the checkpoint directory —
then answers ``fetch`` requests on this very channel until ``bye``, EOF, or the launcher has been
silent for its timeout. A job whose logs all arrived live is thus gathered without opening a single
new SSH channel (issue 13); only what is missing and the chief's checkpoint are sent.
"""

from __future__ import annotations

import os
import select
import time

from .. import protocol as p
from . import files
from .writer import FrameWriter

HIGH_WATER = 8 << 20  # unsent bytes before a file stream waits for the link
MAX_LISTING = 512 << 10  # a larger checkpoint listing is left for the launcher to ask for separately


def adopt_earlier(remote_dir: str, earlier: list[str]) -> None:
    """A task restarted in place: move its earlier incarnations' task directories (their output logs,
    exit.json, what they wrote) into ``earlier/`` of this one, so the gather brings them too. Only
    siblings of this task's own directory, of the same task and attempt (``X`` for ``X-restart-N``)."""
    parent, own = os.path.split(os.path.normpath(remote_dir))
    stem = own.partition("-restart-")[0]
    for path in earlier:
        path = os.path.normpath(os.path.expanduser(path))
        head, name = os.path.split(path)
        if head != parent or name == own or name.partition("-restart-")[0] != stem or not os.path.isdir(path):
            continue
        dest = os.path.join(remote_dir, "earlier")
        if os.path.islink(path) or os.path.islink(dest):
            continue  # only real directories, moved only into a real one
        try:
            os.makedirs(dest, mode=0o700, exist_ok=True)
            os.rename(path, os.path.join(dest, name))
        except OSError:
            continue  # left where it is: the gather of this task does not need it


def task_files(config: p.NodeConfig, remote_dir: str, log_bytes: int | None) -> p.TaskFiles:
    if config.adopt_dirs:
        adopt_earlier(remote_dir, config.adopt_dirs)
    task_dir = p.Manifest.from_dict(files.manifest(remote_dir))
    checkpoint = None
    listed = True
    if config.checkpoint_dir:
        checkpoint = p.Manifest.from_dict(files.manifest(config.checkpoint_dir, (files.TEMP_PREFIX,)))
        if len(p.msg_frame(checkpoint)) > MAX_LISTING:
            checkpoint, listed = None, False
    cleaned = files.clean_temp_copies(config.clean_dirs)["removed"] if config.clean_dirs else []
    return p.TaskFiles(
        task_dir=task_dir, log_bytes=log_bytes, checkpoint=checkpoint, checkpoint_listed=listed, cleaned=cleaned[:4096]
    )


def hand_over(
    config: p.NodeConfig, writer: FrameWriter, in_fd: int, pending: bytes, remote_dir: str, log_bytes: int | None
) -> None:
    """Send ``task_files``; serve ``fetch`` until ``bye``, EOF, or ``launcher_timeout_s`` of silence."""
    try:
        writer.send(p.msg_frame(task_files(config, remote_dir, log_bytes)))
    except (OSError, p.ProtocolError) as exc:  # listing our own disk failed: say so, serve nothing
        writer.send(p.log_frame(p.STDERR, f"worker_entry: cannot list the task's files: {exc}\n".encode()))
        return
    buf = pending
    deadline = time.monotonic() + config.launcher_timeout_s

    def put(data: bytes) -> None:
        writer.send(data)
        if writer.pending > HIGH_WATER and not writer.wait_below(HIGH_WATER // 2, config.launcher_timeout_s):
            raise OSError("the launcher stopped reading")

    while not writer.broken:
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                cmd = p.parse_command(line)
            except p.ProtocolError:
                continue
            deadline = time.monotonic() + config.launcher_timeout_s
            if isinstance(cmd, p.Bye):
                return
            if isinstance(cmd, p.Fetch):
                allowed = {os.path.abspath(os.path.expanduser(r)) for r in (remote_dir, config.checkpoint_dir) if r}
                root = os.path.abspath(os.path.expanduser(cmd.root))
                requests = [{"path": r.path, "offset": r.offset} for r in cmd.files]
                if root not in allowed:  # only what task_files listed: never an arbitrary directory
                    requests = []
                try:
                    files.stream_files(root, requests, put)
                except OSError:
                    return
        if len(buf) > p.MAX_COMMAND_LINE:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select([in_fd], [], [], min(left, 1.0))
        if not ready:
            continue
        try:
            data = os.read(in_fd, 65536)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            return
        buf += data
