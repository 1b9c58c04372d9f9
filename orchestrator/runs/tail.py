"""New complete lines of a growing run-directory file (combined.log, events.jsonl), bounded per read:
what ``logs --follow`` and the Slurm follower read while the launcher writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .rundir import open_regular

MAX_CHUNK = 4 << 20


class Tail:
    """The file need not exist yet; a partial last line waits for its newline (``rest`` gives it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.partial = b""

    def lines(self) -> Iterator[bytes]:
        """Complete lines written since the last call, up to the end of the file as it is now (read
        ``MAX_CHUNK`` bytes at a time: memory stays bounded however much was written)."""
        try:
            f = open_regular(self.path)  # closed below; never a FIFO another user planted
        except OSError:
            return
        with f:
            f.seek(self.pos)
            while True:
                chunk = f.read(MAX_CHUNK)
                if not chunk:
                    return
                self.pos += len(chunk)
                *done, self.partial = (self.partial + chunk).split(b"\n")
                yield from done
                if len(self.partial) > MAX_CHUNK:  # a "line" without end: show it in pieces
                    yield self.partial
                    self.partial = b""

    def rest(self) -> bytes:
        """The unterminated last line (the writer is gone: show it as it is)."""
        rest, self.partial = self.partial, b""
        return rest
