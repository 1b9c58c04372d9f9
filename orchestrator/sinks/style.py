"""Console styling shared by the sinks and the log viewer: colors, only on terminals."""

from __future__ import annotations

import os
from typing import IO

PALETTE = (36, 33, 35, 32, 34, 96, 93, 95, 92, 94, 91, 31)


def use_color(stream: IO) -> bool:
    """Color only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR") is not None:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
