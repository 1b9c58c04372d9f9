"""Console styling shared by the sinks and the log viewer: colors (only on terminals), timestamps."""

from __future__ import annotations

import os
from datetime import UTC, datetime
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


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
