"""A failed task's last lines as a person should read them: the traceback last, tfcluster's own frames folded.

Two things made a failure read worse than it was (issue 32.8):

- **A progress bar after the traceback.** Keras draws its bar with ``\\r`` on stdout; the traceback goes to
  stderr. When the process dies, the node flushes the bar's unfinished text as a line (``agent.output``),
  so it lands *after* the traceback and the last line a user reads is ``3/100 [>....] - ETA: 2s``. Such a
  line is moved before the traceback: the exception is the last line again, nothing is lost.
- **tfcluster's frames inside the user's traceback.** The step clock wraps MWMS's ``_all_reduce``
  (``worker_entry/instrument/stepclock/collectives.py``), so a peer's collective failure runs through our
  code. A run of consecutive frames of ``worker_entry`` (not its ``examples/``, which are user scripts) is
  folded into one line that names them and says they are tfcluster's instrumentation.

The per-task logs keep every line as printed: only the root cause's quote and result.json's
``last_lines`` are tidied. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

TRACEBACK = "Traceback (most recent call last):"
#: Keras' progress bar (tf.keras: ``12/100 [==>...]``; Keras 3: ``12/100 ━━━━``), however it ends.
BAR = re.compile(r"^\s*\d+/\d+ (\[[=>.]*\]|[━─]+)")
#: A traceback frame's first line, with the file it is in.
FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')
OURS = re.compile(r"[/\\](worker_entry[/\\](?!examples[/\\]).+|_site[/\\]sitecustomize\.py)$")


def is_bar(line: str, bars: Collection[str] = ()) -> bool:
    """A progress bar's line: one the node sent as an unfinished redraw (``bars``), or Keras' shape. A
    traceback's own lines never are (a bar on stderr is overdrawn by the traceback that follows it)."""
    if line.strip() == TRACEBACK or FRAME.match(line) is not None:
        return False
    return line.strip() in bars or BAR.match(line) is not None


def bars_last(lines: Sequence[str], bars: Collection[str] = ()) -> list[str]:
    """Progress-bar lines that came after the (first) traceback moved before it, in their order."""
    start = next((i for i, ln in enumerate(lines) if ln.strip() == TRACEBACK), None)
    if start is None:
        return list(lines)
    after = lines[start:]
    moved = [ln for ln in after if is_bar(ln, bars)]
    if not moved:
        return list(lines)
    return [*lines[:start], *moved, *(ln for ln in after if not is_bar(ln, bars))]


def fold_own_frames(lines: Sequence[str]) -> list[str]:
    """Consecutive traceback frames in tfcluster's own modules (each with its source lines) as one line."""
    out: list[str] = []
    run: list[tuple[str, str]] = []  # (file, function) of the frames being folded
    i = 0
    while i < len(lines):
        m = FRAME.match(lines[i])
        if m is not None and OURS.search(m.group("path")):
            run.append((m.group("path"), m.group("func")))
            i += 1
            while i < len(lines) and FRAME.match(lines[i]) is None and lines[i].startswith("    "):
                i += 1  # its source line and carets
            continue
        if run:
            out.append(_folded(run))
            run = []
        out.append(lines[i])
        i += 1
    if run:
        out.append(_folded(run))
    return out


def _folded(run: list[tuple[str, str]]) -> str:
    where = ", ".join(dict.fromkeys(f"{_short(path)} in {func}" for path, func in run))
    what = "frame" if len(run) == 1 else "frames"
    return f"  [{len(run)} {what} of tfcluster's instrumentation, not your code: {where}]"


def _short(path: str) -> str:
    m = OURS.search(path)
    return m.group(1) if m else path


def tidy(lines: Sequence[str], bars: Collection[str] = ()) -> list[str]:
    """The lines to quote for a failure: bars before the traceback, tfcluster's frames folded."""
    return fold_own_frames(bars_last(lines, bars))
