"""A task that tries to drive the user's terminal: it prints a window title (OSC 0), a clipboard write
(OSC 52), a clear screen and cursor moves (CSI), a bell, an 8-bit CSI, bidi overrides and a colour
(SGR) between plain words, then exits 0. For test_terminal_safety_e2e.py."""

import sys

LINES = [
    b"before\x1b]0;pwned-title\x07middle\x1b[2J\x1b[1;1Hafter\n",
    b"copy \x1b]52;c;cm0gLXJmIH4=\x07paste\n",
    b"bell\x07 c1\xc2\x9b6n done\n",
    b"colour \x1b[31mred\x1b[0m plain\n",
    b"bidi \xe2\x80\xaeevil\xe2\x80\xac end\n",
    b"progress 10%\rprogress 100%\n",
]

out = sys.stdout.buffer
for line in LINES:
    out.write(line)
    out.flush()
