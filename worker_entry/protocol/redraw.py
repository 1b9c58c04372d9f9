"""What a terminal leaves of a progress bar's ``\\r``/``\\b`` redraws: one rule for both sides (the node
sends a redrawn line's final text and its progress frames by it; the launcher's console and logs apply it
to what an older node sent as printed). Stdlib only, like the rest of the protocol."""

from __future__ import annotations


def redraw(line: str) -> str:
    """What a terminal would leave of ``\\r`` and ``\\b`` in one line, the simple way: the text after the
    last ``\\r`` (a trailing one, from ``\\r\\n``, is dropped), each ``\\b`` erasing the character before it."""
    line = line.rstrip("\r")
    if "\r" in line:
        line = line.rsplit("\r", 1)[1]
    if "\b" in line:
        out: list[str] = []
        for ch in line:
            if ch == "\b":
                if out:
                    out.pop()
            else:
                out.append(ch)
        line = "".join(out)
    return line


def redraw_lines(data: bytes) -> bytes:
    """Complete lines as a task printed them, each reduced to what ``redraw`` leaves of it (the final text of
    a progress bar's redraw sequence); other bytes (escape sequences included) kept as printed."""
    if b"\r" not in data and b"\b" not in data:
        return data
    text = data.decode("utf-8", "surrogateescape")  # \b erases a character, not a byte; bad bytes kept
    return "\n".join(redraw(line) if ("\r" in line or "\b" in line) else line for line in text.split("\n")).encode(
        "utf-8", "surrogateescape"
    )
