"""The launcher's words for a known mistake a node recognised in the training script (``protocol.Hint``).

A node sends a code and where (file, line), never text for the user's terminal: the wording is here, one
entry per code, and the file name a node sent is made safe before it is shown.
"""

from __future__ import annotations

from worker_entry import protocol as p

from ..core.terminal import safe_text

#: code → what to do. ``late_strategy``: under MWMS, creating the strategy after any dataset, tensor or
#: model raises ``RuntimeError: Collective ops must be configured at program startup`` on every worker.
HINTS: dict[str, str] = {
    "late_strategy": "create `MultiWorkerMirroredStrategy()` before any dataset, tensor or model",
}


def hint_text(hint: p.Hint) -> str:
    """``create `MultiWorkerMirroredStrategy()` before any dataset, tensor or model (line 12 of train.py)``."""
    text = HINTS[hint.code]
    if hint.line is not None and hint.file:
        text += f" (line {hint.line} of {safe_text(hint.file)})"
    elif hint.file:
        text += f" (in {safe_text(hint.file)})"
    return text
