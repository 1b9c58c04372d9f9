"""Text that came from a node, made safe for the user's terminal.

A task's output, a node's facts (hostname, GPU names) and the messages it sends are the node's to
choose; printed raw, an escape sequence in them drives the user's terminal — sets the window title
(OSC), clears the screen, moves the cursor (CSI), writes to the clipboard (OSC 52), changes the
character set, answers back. Everything that came from a node goes through ``safe_text`` (or
``safe_bytes``) before it reaches a terminal; the run directory keeps the bytes as printed (the
record). What is done:

- escape sequences (``ESC [ … final``, ``ESC ] … BEL/ST``, ``ESC P/X/^/_ … ST``, ``ESC`` + one
  character, and their 8-bit C1 forms) are removed, the text around them kept. Plain SGR colour
  codes (``ESC [ 1;31 m``: digits and ``;`` only) stay when the caller shows colours, and a line that
  set one ends with a reset so the colour cannot leak into the next line's prefix;
- any other control character (C0 but tab and newline, DEL, C1) and the Unicode bidi controls that
  reorder what is shown (Trojan source) are shown escaped (``\\x07``, ``\\u202e``);
- ``\\r`` and ``\\b`` are applied the simple way (``redraw``): a line shows what follows its last
  ``\\r``, a ``\\b`` erases the character before it. ``redraw_lines`` does the same to the complete lines
  of a task's output before they are logged (a Keras epoch's hundreds of redraws become its final bar).
"""

from __future__ import annotations

import re

from worker_entry.protocol.redraw import redraw
from worker_entry.protocol.redraw import redraw_lines as redraw_lines  # the one rule, re-exported for the launcher

#: Fast path: bytes that need no work (printable ASCII, tab, newline) are passed through untouched.
_NEEDS_WORK = re.compile(rb"[^\t\n\x20-\x7e]")
_NEEDS_WORK_TEXT = re.compile(r"[^\t\n\x20-\x7e]")
_SEQUENCE = re.compile(
    r"\x1b\[(?P<csi>[0-?]*[ -/]*)(?P<final>[@-~])"  # CSI (SGR is CSI digits;digits m)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: title, clipboard, hyperlinks
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]"  # two-character escapes (charset, keypad, reset ESC c, ...)
    r"|\x1b"  # a lone ESC at the end
)
_SGR = re.compile(r"[0-9;]{0,32}")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
RESET = "\x1b[0m"


def safe_text(text: str, *, keep_sgr: bool = False) -> str:
    """``text`` (one or more lines) without anything that drives a terminal; see the module docstring."""
    if not _NEEDS_WORK_TEXT.search(text):
        return text
    return "\n".join(_safe_line(line, keep_sgr) for line in text.split("\n"))


def safe_bytes(data: bytes, *, keep_sgr: bool = False) -> bytes:
    """``safe_text`` for bytes as a task printed them (UTF-8; invalid bytes become U+FFFD on screen)."""
    if not _NEEDS_WORK.search(data):
        return data
    return safe_text(data.decode("utf-8", "replace"), keep_sgr=keep_sgr).encode("utf-8")


def _safe_line(line: str, keep_sgr: bool) -> str:
    """One line: ``\r``/``\b`` first (so that no erase can complete a sequence), then every sequence
    removed (SGR kept when asked), then what is left of control characters escaped."""
    line = redraw(line)
    out: list[str] = []
    pos = 0
    coloured = False
    for m in _SEQUENCE.finditer(line):
        out.append(_CONTROL.sub(_escaped, line[pos : m.start()]))
        if keep_sgr and m.group("final") == "m" and _SGR.fullmatch(m.group("csi") or ""):
            out.append(m.group(0))
            coloured = True
        pos = m.end()
    out.append(_CONTROL.sub(_escaped, line[pos:]))
    return "".join(out) + (RESET if coloured else "")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
